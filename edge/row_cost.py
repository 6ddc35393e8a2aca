"""What a target forward costs by the session's rows in it: the curve the controller prices blocks with.

Each verdict reports the forward that answered it (``Verdict.forward_us``) and the session's rows in
it (``Verdict.forward_rows``); the ``Opened`` says how many rows the verifier's forwards cost alike
(``Opened.row_tile``: on a CPU in canonical shapes, the tile its products are padded to; 1 where every
row costs). Rows are counted in tiles (a forward of r rows costs what ceil(r / tile) tiles do), and
each tile count keeps a moving average of the forwards measured at it.

A prediction for a tile count is its own average where measured; between two measured counts, on the
line between them; below them all, the fewest's; past them all, the last measured one's plus the
least-squares slope through them all (at least 0: more rows never cost less; 0 from one point: a
forward is known to cost that, and nothing yet says that more rows cost more). So rows inside the tile
are free from the first verdict on, and rows past it are priced from the second row count measured.
"""

from __future__ import annotations

import math

from shared.stats import Ewma

__all__ = ["RowCost", "MOST_ROWS"]

# A session's rows in one forward are at most its blocks in flight times a block's drafts and branches (a
# few hundred); a verifier's ``forward_rows`` past this is not believed (the curve stays a few points).
MOST_ROWS = 4096


class RowCost:
    """Seconds of a forward by the session's rows in it (``observe``, ``predict``)."""

    def __init__(self, tile: int = 1) -> None:
        self.tile = max(tile, 1)
        self._by_tiles: dict[int, Ewma] = {}

    def set_tile(self, tile: int) -> None:
        """The verifier's row tile (``Opened.row_tile``; 0: not said, counted as 1). A new tile (another
        replica, other shapes) forgets what the old one measured."""
        tile = max(tile, 1)
        if tile != self.tile:
            self.tile, self._by_tiles = tile, {}

    def tiles(self, rows: int) -> int:
        """Tiles a forward of ``rows`` rows costs (at least one)."""
        return max(math.ceil(rows / self.tile), 1)

    def observe(self, rows: int, seconds: float) -> None:
        """A forward of ``seconds`` that held ``rows`` of the session's rows (nothing when either is 0:
        not reported, or rows are past ``MOST_ROWS``)."""
        if 0 < rows <= MOST_ROWS and seconds > 0:
            self._by_tiles.setdefault(self.tiles(rows), Ewma()).add(seconds)

    @property
    def measured(self) -> dict[int, float]:
        """Seconds by tile count, where measured."""
        return {tiles: estimate.value for tiles, estimate in sorted(self._by_tiles.items())}

    def predict(self, rows: int) -> float | None:
        """Seconds of a forward holding ``rows`` of the session's rows; None before any was measured."""
        points = self.measured
        if not points:
            return None
        tiles = self.tiles(rows)
        if tiles in points:
            return points[tiles]
        below = [x for x in points if x < tiles]
        above = [x for x in points if x > tiles]
        if below and above:  # between two measured tile counts: on the line between them
            low, high = max(below), min(above)
            return points[low] + (points[high] - points[low]) * (tiles - low) / (high - low)
        if not below:  # fewer tiles than any measured: priced as the fewest measured
            return points[min(above)]
        last = max(below)  # more tiles than any measured: the measured slope on from the last
        return points[last] + self._slope(points) * (tiles - last)

    @staticmethod
    def _slope(points: dict[int, float]) -> float:
        """Seconds a tile adds: the least-squares slope through the measured points, at least 0 (none
        known from one point)."""
        if len(points) < 2:
            return 0.0
        mean_x = sum(points) / len(points)
        mean_y = sum(points.values()) / len(points)
        spread = sum((x - mean_x) ** 2 for x in points)
        return max(sum((x - mean_x) * (y - mean_y) for x, y in points.items()) / spread, 0.0)

    def extra(self, rows: int, more: int) -> float | None:
        """Seconds ``more`` rows add to a forward of ``rows`` (None before any forward was measured)."""
        with_more, without = self.predict(rows + more), self.predict(rows)
        return None if with_more is None or without is None else max(with_more - without, 0.0)

    def describe(self) -> str:
        """The measured points, e.g. ``tile 2: 1x 90 ms, 3x 140 ms`` (for debug logs)."""
        points = ", ".join(f"{tiles}x {seconds * 1e3:.0f} ms" for tiles, seconds in self.measured.items())
        return f"tile {self.tile}: {points or '-'}"
