"""TextStream: hold partial UTF-8 and possible stop-string prefixes; release everything else at once."""

from tiergate.edge_node.server.textstream import TextStream


def feed_all(ts: TextStream, pieces: list[bytes]) -> list[str]:
    return [ts.feed(p) for p in pieces]


def test_plain_ascii_passes_through_token_by_token():
    ts = TextStream()
    assert feed_all(ts, [b"Hel", b"lo", b" world"]) == ["Hel", "lo", " world"]
    assert ts.flush() == ""


def test_multibyte_character_split_across_tokens_is_held_until_complete():
    raw = "café 日本".encode()
    i = raw.index(b"\xc3")  # é = c3 a9
    j = raw.index(b"\xe6")  # 日 = e6 97 a5
    ts = TextStream()
    out = feed_all(ts, [raw[:i + 1], raw[i + 1:j + 1], raw[j + 1:j + 2], raw[j + 2:]])
    assert out == ["caf", "é ", "", "日本"]
    assert "".join(out) + ts.flush() == "café 日本"


def test_incomplete_bytes_at_end_become_replacement_char():
    ts = TextStream()
    assert ts.feed(b"ok\xe6\x97") == "ok"
    assert ts.flush() == "\ufffd"


def test_stop_string_inside_one_token_cuts_text_and_sets_stopped():
    ts = TextStream(["END"])
    assert ts.feed(b"abcENDxyz") == "abc"
    assert ts.stopped
    assert ts.feed(b"more") == "" and ts.flush() == ""


def test_stop_string_split_across_tokens_is_never_emitted():
    ts = TextStream(["</answer>"])
    out = feed_all(ts, [b"42 </", b"ans", b"wer> trailing"])
    assert out == ["42 ", "", ""]
    assert ts.stopped


def test_held_prefix_is_released_when_the_stop_string_does_not_complete():
    ts = TextStream(["STOP"])
    assert ts.feed(b"a ST") == "a "
    assert ts.feed(b"ART") == "START"
    assert not ts.stopped


def test_prefix_held_at_end_is_flushed():
    ts = TextStream(["\n\n"])
    assert ts.feed(b"line\n") == "line"
    assert ts.flush() == "\n"


def test_earliest_of_several_stop_strings_wins():
    ts = TextStream(["zz", "b"])
    assert ts.feed(b"a b zz") == "a "
    assert ts.stopped


def test_empty_stop_strings_are_ignored():
    ts = TextStream(["", "x"])
    assert ts.feed(b"abc") == "abc"
