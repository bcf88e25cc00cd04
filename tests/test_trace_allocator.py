"""The caching-allocator replay against CUDACachingAllocator's rules, worked by hand (no torch needed).

Constants from c10/cuda/CUDACachingAllocator.cpp: blocks are multiples of 512 B; requests up to
1 MiB use the small pool with 2 MiB segments; requests under 10 MiB get 20 MiB segments; larger
ones a segment of their size rounded up to 2 MiB; a large block is split only when more than
1 MiB would remain, a small one when at least 512 B would.
"""

import pytest

from memest.trace.allocator import CachingAllocator, allocation_size, round_size

KiB = 1024
MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("nbytes", "block"),
    [(1, 512), (512, 512), (513, 1024), (4 * 1000, 4096), (MiB + 1, MiB + 512)],
    ids=["1B", "512B", "513B", "4000B", "1MiB+1"],
)
def test_round_size_is_a_multiple_of_512_at_least_512(nbytes: int, block: int) -> None:
    assert round_size(nbytes) == block


@pytest.mark.parametrize(
    ("size", "segment"),
    [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB),
     (11 * MiB + 1, 12 * MiB)],
    ids=["small", "1MiB-small", "just-large", "under-10MiB", "10MiB", "11MiB+1->12MiB"],
)
def test_segment_size_by_request(size: int, segment: int) -> None:
    assert allocation_size(size) == segment


def test_small_requests_share_one_2mib_segment() -> None:
    a = CachingAllocator()
    a.malloc(0, 1000)  # -> 1024-byte block in a new 2 MiB segment
    a.malloc(1, 3000)  # -> 3072-byte block split from the same segment
    assert a.allocated_bytes == 1024 + 3072
    assert a.reserved_bytes == 2 * MiB
    assert a.requested_bytes == 4000
    assert a.num_segments == 1


def test_large_requests_carve_a_20mib_segment_until_the_rest_is_too_small_to_split() -> None:
    a = CachingAllocator()
    for handle in range(3):
        a.malloc(handle, 5 * MiB)  # 20 -> 15 -> 10 -> 5 MiB remain, each remainder > 1 MiB: split
    assert a.reserved_bytes == 20 * MiB
    a.malloc(3, 5 * MiB)  # the last 5 MiB block fits exactly: no remainder
    assert (a.reserved_bytes, a.allocated_bytes) == (20 * MiB, 20 * MiB)
    a.malloc(4, 5 * MiB)  # nothing cached fits: a second 20 MiB segment
    assert a.reserved_bytes == 40 * MiB


def test_a_block_is_not_split_when_at_most_1mib_would_remain_and_all_of_it_counts_as_allocated() -> None:
    a = CachingAllocator()
    a.malloc(0, 4 * MiB)  # new 20 MiB segment, split: 16 MiB free
    a.free(0)  # merged back: one free 20 MiB block
    a.malloc(1, 19 * MiB + 512 * KiB)  # best fit is the 20 MiB block; 0.5 MiB would remain (<= 1 MiB): not split
    assert a.allocated_bytes == 20 * MiB  # torch.cuda.memory_allocated counts the whole block
    assert a.requested_bytes == 19 * MiB + 512 * KiB
    assert a.reserved_bytes == 20 * MiB


def test_freed_neighbours_merge_so_a_bigger_request_reuses_the_segment() -> None:
    a = CachingAllocator()
    a.malloc(0, 4 * MiB)
    a.malloc(1, 4 * MiB)  # both from one 20 MiB segment (12 MiB left)
    a.free(0)
    a.free(1)  # 4 + 4 + 12 merge into one free 20 MiB block
    a.malloc(2, 18 * MiB)  # fits only in the merged block
    assert a.reserved_bytes == 20 * MiB
    assert a.num_segments == 1


def test_best_fit_takes_the_smallest_free_block_that_fits() -> None:
    a = CachingAllocator()
    a.malloc(0, 30 * MiB)  # segment A: 30 MiB
    a.malloc(1, 12 * MiB)  # segment B: 12 MiB
    a.free(0)
    a.free(1)
    a.malloc(2, 11 * MiB)  # fits both; best fit is the 12 MiB block (1 MiB remains, not split)
    assert a.allocated_bytes == 12 * MiB
    a.malloc(3, 25 * MiB)  # the 30 MiB block is still free
    assert a.reserved_bytes == 42 * MiB


def test_pools_are_separate_small_blocks_never_serve_large_requests() -> None:
    a = CachingAllocator()
    a.malloc(0, MiB)  # small pool, 2 MiB segment
    a.free(0)
    a.malloc(1, MiB + 512)  # large: the free 2 MiB small-pool block is not eligible
    assert a.reserved_bytes == 2 * MiB + 20 * MiB


def test_peaks_track_the_highest_allocated_and_reserved() -> None:
    a = CachingAllocator()
    a.malloc(0, 12 * MiB)
    a.malloc(1, 12 * MiB)
    a.free(0)
    a.free(1)
    a.malloc(2, 2 * MiB)  # best fit: a free 12 MiB block, split (10 MiB remain); no new segment
    assert a.peak_allocated_bytes == 24 * MiB
    assert a.peak_reserved_bytes == 24 * MiB
    assert a.reserved_bytes == 24 * MiB


def test_zero_byte_requests_take_no_block() -> None:
    a = CachingAllocator()
    assert a.malloc(0, 0) == 0
    assert a.free(0) == 0
    assert (a.allocated_bytes, a.reserved_bytes) == (0, 0)


def test_reusing_a_live_handle_is_a_programming_error() -> None:
    a = CachingAllocator()
    a.malloc(0, 10)
    with pytest.raises(ValueError, match="already allocated"):
        a.malloc(0, 10)
