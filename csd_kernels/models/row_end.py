"""The layout with a forced row-end token after each row's last grid token (Lumina-mGPT, Emu3): the adapter base
:class:`RowEndLayout`, and its draft trees.

Draft trees: a tree node at grid position k = first + depth[s] with k % width == width - 1 gets its own forced row-end
input (its companion): the node's only child in the sequence (no siblings; never drafted or verified, as in the
chain), whose output predicts the grid token after the row end, i.e. the node's children. One forward feeds T = W + E
inputs: the W nodes at cache slots base + s, then the companions at base + W + j (the j-th forced node in slot order).
E, the most nodes of one window at row ends over every window start (``forced_room``), is fixed per layout, so every
call has the same shapes; a row with fewer forced nodes feeds unused companions that nothing sees.

Shapes: R model rows, W window slots (nodes), E companion slots, L path depths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import CachedImageLM
from .cache import move_rows, tree_visibility

__all__ = ["RowEndLayout", "Companions", "forced_room", "companions", "companion_ancestor", "path_moves"]


def forced_room(depth: torch.Tensor, width: int) -> int:
    """E: the most window nodes at row ends over the window's start (depth [W] of the layout, on the host)."""
    return int(torch.bincount(depth.cpu() % width, minlength=width).max())


@dataclass
class Companions:
    forced: torch.Tensor  # [R, W] bool: node s sits at a row end (its output is its companion's)
    rank: torch.Tensor  # [R, W] int64: node s's companion j (E where s has none)
    owner: torch.Tensor  # [R, E] int64: the node of companion j (0 for an unused one)
    used: torch.Tensor  # [R, E] bool


def companions(first: torch.Tensor, depth: torch.Tensor, width: int, room: int) -> Companions:
    """Which nodes get a forced row end, for windows starting at x_{first_r} (first [R], depth [W])."""
    k = first[:, None] + depth[None, :]  # [R, W] grid position of each node
    forced = (k >= 0) & (k % width == width - 1)
    rank = torch.where(forced, forced.cumsum(1) - 1, room)
    slots = torch.arange(depth.shape[0], device=depth.device).expand_as(rank)
    owner = torch.zeros(rank.shape[0], room + 1, dtype=torch.int64, device=depth.device).scatter(1, rank, slots)
    used = torch.arange(room, device=depth.device)[None, :] < forced.sum(1, keepdim=True)
    return Companions(forced, rank, owner[:, :room], used)


def companion_ancestor(ancestor: torch.Tensor, comp: Companions) -> torch.Tensor:
    """bool [R, W + E, W + E]: input t is input s or above it. A companion is below its node and above the node's
    descendants; an unused companion is only itself."""
    rows, room = comp.owner.shape
    width = ancestor.shape[0]
    eye = torch.eye(width, dtype=torch.bool, device=ancestor.device)
    strict = (ancestor & ~eye)[None].expand(rows, -1, -1)  # [R, W, W] t strictly above s
    used = comp.used
    node_comp = strict.gather(2, comp.owner[:, None, :].expand(-1, width, -1)) & used[:, None, :]  # [R, W, E]
    comp_node = ancestor[None].expand(rows, -1, -1).gather(1, comp.owner[:, :, None].expand(-1, -1, width))
    comp_node = comp_node & used[:, :, None]  # [R, E, W]: the companion's node and everything above it
    above_owner = strict.gather(1, comp.owner[:, :, None].expand(-1, -1, width))  # [R, E, W]
    comp_comp = above_owner.gather(2, comp.owner[:, None, :].expand(-1, room, -1)) & used[:, :, None] \
        & used[:, None, :]
    comp_comp = comp_comp | torch.eye(room, dtype=torch.bool, device=ancestor.device)
    top = torch.cat([ancestor[None].expand(rows, -1, -1), node_comp], 2)
    return torch.cat([top, torch.cat([comp_node, comp_comp], 2)], 1)


def path_moves(path: torch.Tensor, comp: Companions, node_slot: torch.Tensor):
    """(destination, source) [R, 2L] cache slots, relative to the window's base, that move the accepted path and its
    companions into the chain layout. path [R, L] window slots by depth (-1: keep); node_slot [R, L] the chain slot
    of depth d's grid token (relative), its row end one after. A depth without a companion repeats its node's
    move (the same value written twice); so does a depth that keeps its slot."""
    window, kept = comp.forced.shape[1], path >= 0
    node = path.clamp(min=0)
    node_source = torch.where(kept, node, node_slot)
    forced = comp.forced.gather(1, node) & kept  # depth d's grid position is at a row end (as every node of d)
    rank = comp.rank.gather(1, node)
    comp_dest = torch.where(forced, node_slot + 1, node_slot)
    comp_source = torch.where(forced, torch.where(kept, window + rank, comp_dest), node_source)
    return torch.cat([node_slot, comp_dest], 1), torch.cat([node_source, comp_source], 1)


class RowEndLayout(CachedImageLM):
    """A forced row-end token after every grid row (Lumina-mGPT, Emu3): the sequence index of x_k is
    P + k + k // width; the chain forwards insert the row ends, a draft tree gives every node at a row's last grid
    position its own (companions). A subclass sets ``row_end_token_id``."""

    _forced_room = 0  # E of the draft tree static_cache() was given (companions)
    _companions = None  # the last forward_tree's companions, for keep_path

    def _seq_index(self, k):
        return self.prompt_len + k + (k // self.grid[1] if k >= 0 else 0)

    def _window(self, ids, first):
        # ids [R, L] model ids of x_first .. x_{first+L-1}; a row end follows every x_k with k % W == W - 1
        rows, length = ids.shape
        width = self.grid[1]
        k = torch.arange(first, first + length, device=ids.device)  # [L]
        row_end = ((k >= 0) & (k % width == width - 1)).to(torch.int64)  # [L]
        # number of row ends among x_first .. x_{first+L-1}, on the host from ints (no device sync)
        ends = (first + length) // width - max(first, 0) // width
        slot = torch.arange(length, device=ids.device) + row_end.cumsum(0) - row_end  # [L] sequence slot of x_k
        seq = torch.full((rows, length + ends), self.row_end_token_id, dtype=ids.dtype, device=ids.device)
        seq[:, slot] = ids  # [R, T]
        keep = None if ends == 0 else slot + row_end  # output slot that predicts x_{k+1}
        return {"input_ids": seq}, keep

    def _static_span(self, window):
        return window + -(-window // self.grid[1])  # W inputs and at most ceil(W / width) row ends among them

    def _window_static(self, ids, first):
        # per row: x_first .. x_{first+W-1} with a row end after every x_k, k % width == width - 1; trailing spare
        # slots hold row ends too (past every real input: nothing reads them before they are overwritten)
        ids, _ = self._at_prompt_end(ids, first)
        rows, length = ids.shape
        width, span = self.grid[1], self._static_span(length)
        k = first[:, None] + torch.arange(length, device=ids.device)[None, :]  # [R, W]
        row_end = ((k >= 0) & (k % width == width - 1)).to(torch.int64)
        slot = torch.arange(length, device=ids.device)[None, :] + row_end.cumsum(1) - row_end  # [R, W]
        seq = torch.full((rows, span), self.row_end_token_id, dtype=ids.dtype, device=ids.device)
        seq = seq.scatter(1, slot, ids)  # [R, T]
        base = self._seq_indices(first)  # [R]
        slots = base[:, None] + torch.arange(span, device=ids.device)[None, :]
        return {"input_ids": seq}, slots, slot + row_end

    def _seq_indices(self, k):
        return self.prompt_len + k + torch.where(k >= 0, k // self.grid[1], 0)  # _seq_index of a tensor of k

    # draft trees: every node at a row's last grid position gets its own forced row end (companions)
    supports_tree = True

    def static_cache(self, window, tree=None):
        super().static_cache(window, tree)
        self._forced_room = 0 if tree is None else forced_room(tree.depth, self.grid[1])

    def _tree_span(self, window):
        return window + self._forced_room

    @torch.no_grad()
    def forward_tree(self, tokens, first, depth, ancestor):
        """CachedImageLM.forward_tree with the forced row ends: W nodes, then E companions (companions); a node at
        a row end returns its companion's logits."""
        ids = self._to_model_ids(tokens)  # [B, W]
        if self.cfg:
            ids, first = torch.cat([ids, ids], 0), torch.cat([first, first], 0)  # [R, W], [R]
        ids, _ = self._at_prompt_end(ids, first)
        window, room, depth = ids.shape[1], self._forced_room, depth.to(ids.device)
        if room == 0:
            raise ValueError(f"{type(self).__name__}.forward_tree: call static_cache(window, tree=layout) before the "
                             "prefill (the tree's row ends need room in the cache)")
        comp = self._companions = companions(first, depth, self.grid[1], room)
        node_seq = self._seq_indices(first[:, None] + depth[None, :])  # [R, W]
        positions = torch.cat([node_seq, node_seq.gather(1, comp.owner) + 1], 1)  # [R, W + E]
        row_ends = torch.full_like(ids[:, :1], self.row_end_token_id).expand(-1, room)
        base = self._seq_indices(first)  # [R]
        slots = base[:, None] + torch.arange(window + room, device=ids.device)[None, :]
        visible = tree_visibility(base, companion_ancestor(ancestor.to(ids.device), comp), self.cache.capacity,
                                  self._key_valid)
        hidden = self._run_rows({"input_ids": torch.cat([ids, row_ends], 1)}, slots, visible, positions)
        out = torch.where(comp.forced, window + comp.rank, torch.arange(window, device=ids.device))  # [R, W]
        logits = self._head(hidden.gather(1, out[..., None].expand(-1, -1, hidden.shape[-1])))
        if self.cfg:
            return logits[: self.batch], logits[self.batch :]
        return logits, None

    def keep_path(self, first, path):
        """Moves the last forward_tree's accepted path and its row ends into the chain layout (slot _seq_index of
        each grid token, its row end one after)."""
        if self.cfg:
            first, path = torch.cat([first, first], 0), torch.cat([path, path], 0)
        base = self._seq_indices(first)[:, None]  # [R, 1]
        depth = torch.arange(path.shape[1], device=path.device)[None, :]
        destination, source = path_moves(path, self._companions, self._seq_indices(first[:, None] + depth) - base)
        for layer in self.cache.layers:
            move_rows(layer.keys, base + destination, base + source)
            move_rows(layer.values, base + destination, base + source)
