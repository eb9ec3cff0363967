"""Draft trees over a layout with a forced row-end token after each row's last grid token (Lumina-mGPT).

A tree node at grid position k = first + depth[s] with k % width == width - 1 gets its own forced row-end input (its
companion): the node's only child in the sequence (no siblings; never drafted or verified, as in the chain), whose
output predicts the grid token after the row end, i.e. the node's children. One forward feeds T = W + E inputs: the W
nodes at cache slots base + s, then the companions at base + W + j (the j-th forced node in slot order). E, the most
nodes of one window at row ends over every window start (``forced_room``), is fixed per layout, so every call has
the same shapes; a row with fewer forced nodes feeds unused companions that nothing sees.

Shapes: R model rows, W window slots (nodes), E companion slots, L path depths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Companions", "forced_room", "companions", "companion_ancestor", "path_moves"]


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
