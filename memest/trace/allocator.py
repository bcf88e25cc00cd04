"""A replay of PyTorch's CUDA caching allocator: what ``torch.cuda`` would report as allocated and reserved.

Given the stream of tensor allocations and frees a trace records, :class:`CachingAllocator` hands
out blocks the way ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator::malloc`` /
``free``, PyTorch 2.x, default settings) does for one device and one stream:

- every request is rounded up to a multiple of 512 bytes (``round_size``; ``kMinBlockSize``);
  zero-byte requests take no block;
- requests of at most 1 MiB (``kSmallSize``) come from the small pool, larger ones from the
  large pool; a request is served by the smallest cached free block of its pool that is big
  enough (best fit; ties go to the lower address);
- when no cached block fits, a new segment is reserved (``get_allocation_size``): 2 MiB
  (``kSmallBuffer``) for a small request, 20 MiB (``kLargeBuffer``) for a request under 10 MiB
  (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
- a block larger than the request is split (``should_split``) when the remainder is at least
  512 bytes (small pool) or more than 1 MiB (large pool); otherwise the whole block is handed
  out and counted as allocated, as ``torch.cuda.memory_allocated`` counts it;
- a freed block merges with free neighbours of its segment (``try_merge_blocks``); segments
  are never returned to the device (no ``empty_cache``, no out-of-memory retry).

Defaults only: ``max_split_size_mb``, ``roundup_power2_divisions``, ``expandable_segments`` and
``garbage_collection_threshold`` are not modelled. Pure Python; it imports no torch.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK_SIZE = 512
"""``kMinBlockSize``: every allocation is rounded up to a multiple of this many bytes."""
SMALL_SIZE = 1 << 20
"""``kSmallSize``: the largest request served from the small pool (1 MiB)."""
SMALL_BUFFER = 2 << 20
"""``kSmallBuffer``: the segment reserved for small requests (2 MiB)."""
LARGE_BUFFER = 20 << 20
"""``kLargeBuffer``: the segment reserved for requests between 1 and 10 MiB (20 MiB)."""
MIN_LARGE_ALLOC = 10 << 20
"""``kMinLargeAlloc``: requests of this size or more get a segment of their own size."""
ROUND_LARGE = 2 << 20
"""``kRoundLarge``: segments for large requests are rounded up to 2 MiB."""


def round_size(nbytes: int) -> int:
    """Bytes of the block a request of ``nbytes`` needs (``round_size``): a multiple of 512, at least 512."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * ((nbytes + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """Bytes of the segment reserved when no cached block fits a rounded request (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass(slots=True, eq=False)
class _Block:
    size: int
    address: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None


class _Pool:
    """Free blocks of one pool, ordered by (size, address) like ``BlockComparatorSize``."""

    __slots__ = ("blocks", "keys")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, _Block] = {}

    def insert(self, block: _Block) -> None:
        bisect.insort(self.keys, (block.size, block.address))
        self.blocks[block.address] = block

    def remove(self, block: _Block) -> None:
        i = bisect.bisect_left(self.keys, (block.size, block.address))
        del self.keys[i]
        del self.blocks[block.address]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.keys, (size, -1))
        if i == len(self.keys):
            return None
        block = self.blocks[self.keys[i][1]]
        del self.keys[i]
        del self.blocks[block.address]
        return block


class CachingAllocator:
    """One device's caching allocator (one stream), replayed from allocation events.

    Attributes:
        allocated_bytes: Bytes in blocks handed out now (``torch.cuda.memory_allocated``).
        reserved_bytes: Bytes in segments reserved from the device (``torch.cuda.memory_reserved``).
        requested_bytes: Bytes the live requests asked for, before rounding.
        peak_allocated_bytes: Highest allocated_bytes so far (``max_memory_allocated``).
        peak_reserved_bytes: Highest reserved_bytes so far (``max_memory_reserved``).
        num_segments: Segments reserved (``cudaMalloc`` calls).
    """

    def __init__(self) -> None:
        self._small = _Pool()
        self._large = _Pool()
        self._live: dict[int, tuple[_Block, int]] = {}
        self._next_address = 0
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.requested_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.num_segments = 0

    def malloc(self, handle: int, nbytes: int) -> int:
        """Allocate ``nbytes`` for ``handle``; returns the block's size (0 for a zero-byte request).

        Raises:
            ValueError: ``handle`` is already allocated, or ``nbytes`` is negative.
        """
        if handle in self._live:
            raise ValueError(f"handle {handle} is already allocated")
        if nbytes < 0:
            raise ValueError(f"nbytes is {nbytes}; it must be >= 0")
        if nbytes == 0:
            return 0
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._small if small else self._large
        block = pool.best_fit(size)
        if block is None:
            segment = allocation_size(size)
            block = _Block(segment, self._next_address, small)
            self._next_address += segment
            self.reserved_bytes += segment
            self.num_segments += 1
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        remaining = block.size - size
        if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
            rest = _Block(remaining, block.address + size, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated = True
        self._live[handle] = (block, nbytes)
        self.allocated_bytes += block.size
        self.requested_bytes += nbytes
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block.size

    def free(self, handle: int) -> int:
        """Free ``handle``'s block; returns its size (0 when the handle holds no block: a zero-byte request)."""
        entry = self._live.pop(handle, None)
        if entry is None:
            return 0
        block, nbytes = entry
        freed = block.size
        self.allocated_bytes -= freed
        self.requested_bytes -= nbytes
        block.allocated = False
        pool = self._small if block.small else self._large
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            pool.remove(prev)
            block.address = prev.address
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        if nxt is not None and not nxt.allocated:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        pool.insert(block)
        return freed

    def is_live(self, handle: int) -> bool:
        """True while ``handle`` holds a block (zero-byte requests never do)."""
        return handle in self._live
