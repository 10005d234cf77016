"""The stream layout's key space: one shard on a server, `{prefix:k}` shards on a Cluster, an entry's shard
fixed by its id, and only this prefix's entry keys owned (another deployment's prefix may start with ours)."""

from __future__ import annotations

import zlib

from tiergate.cache.redis.shards import Shard, Shards


def test_one_server_has_one_shard_named_by_the_prefix() -> None:
    shards = Shards("tiergate:cache", cluster=False, count=16)
    assert list(shards) == [Shard("tiergate:cache", "tiergate:cache:z", "tiergate:cache:ev")]
    assert shards.of("abc-1").key("abc-1") == "tiergate:cache:e:abc-1"
    assert shards.index_of("anything") == 0
    assert shards.entry_glob == "tiergate:cache:e:"


def test_a_cluster_spreads_entries_over_hash_tagged_shards_by_id() -> None:
    shards = Shards("tiergate:cache", cluster=True, count=4)
    assert len(shards) == 4 and shards[3].prefix == "{tiergate:cache:3}"
    assert shards[3].stream == "{tiergate:cache:3}:ev"
    eid = "abc-1"
    assert shards.index_of(eid) == zlib.crc32(eid.encode()) % 4
    assert shards.of(eid) is shards[shards.index_of(eid)]
    assert shards.entry_glob == "{tiergate:cache:*}:e:"


def test_only_this_prefix_s_entry_keys_are_owned() -> None:
    shards = Shards("tiergate:cache", cluster=True, count=4)
    assert shards.owned(b"{tiergate:cache:2}:e:abc-1") == (shards[2], "abc-1")
    assert shards.owned(b"{tiergate:cache:eu:2}:e:abc-1") is None  # another deployment, matched by the glob
    assert shards.owned(b"{tiergate:cache:9}:e:abc-1") is None  # not one of our shards
    assert shards.owned(b"{tiergate:cache:2}:e:") is None
    assert shards.owned(b"{tiergate:cache:2}:z") is None
