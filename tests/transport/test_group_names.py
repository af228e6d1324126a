"""A group is named as it is in every error about it: the default group is
"world", any other (a subgroup, or the group `distir.recover()` formed from
the survivors) names its ranks; errors on a recovered group said "world"."""

from __future__ import annotations

import torch.distributed as dist

from distir.runtime.membership import JOIN_WINDOW_SHARE, recover
from distir.transport.groups import ProcessGroupResource


def test_a_group_other_than_the_world_is_named_by_its_ranks(one_rank_world):
    assert ProcessGroupResource(None).name == "world"
    group = dist.new_group([0])
    try:
        resource = ProcessGroupResource(group)
        assert resource.name == "of ranks [0]"
        assert "group of ranks [0]" in repr(resource)
    finally:
        dist.destroy_process_group(group)


def test_the_recover_docstring_states_the_join_window_the_code_uses():
    assert f"{JOIN_WINDOW_SHARE:.0%}" in " ".join(recover.__doc__.split())
