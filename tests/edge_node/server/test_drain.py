"""`edge-node serve` exits (for its service manager to restart it) when the engine reports a failure."""

from __future__ import annotations

import asyncio
import threading

from tiergate.edge_node.server.drain import DrainingServer


class _Registrar:
    def __init__(self) -> None:
        self.deregistered = False

    async def deregister(self) -> bool:
        self.deregistered = True
        return True


def test_an_engine_failure_deregisters_and_stops_the_server():
    registrar = _Registrar()
    server = DrainingServer(lambda *a: None, "127.0.0.1", 0, 1.0, state=None, registrar=registrar,
                             log_level="warning")

    async def main() -> None:
        server._loop = asyncio.get_running_loop()
        # Called from the engine's own thread, as the engine does when its decode loop dies.
        t = threading.Thread(target=server.engine_failed, args=("engine failure: boom",))
        t.start()
        t.join()
        for _ in range(100):
            if server.server.should_exit:
                return
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert server.server.should_exit and registrar.deregistered
