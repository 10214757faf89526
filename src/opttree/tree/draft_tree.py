"""DraftTree: the tokens a drafter proposes, as a tree in topological order.

Glossary (see DESIGN.md): the *root* is the last committed token, not stored as a node; node i
holds ``tokens[i]``, hangs under ``parents[i]`` (-1 = the root) and has path probability
``path_probs[i]`` = p̂, the product of the draft probabilities on the path root→i. Parents always
come before their children (``parents[i] < i``).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch


@dataclass(frozen=True)
class DraftTree:
    """A draft tree as tensors, all on one device (nothing here reads values back to the host
    unless a method says so).

    ``depth`` and ``ancestors`` are derived from ``parents``; builders that grow a tree layer by
    layer pass them along (:meth:`first_layer`, :meth:`extend`: one gather per layer), anything
    else gets them computed on first use. ``check=False`` skips the parents-first check (a host
    read), for trees opttree grew itself.
    """

    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long, -1 = child of the root
    path_probs: torch.Tensor  # [n] float, p̂
    depth: torch.Tensor | None = None  # [n] long: 1 for the root's children, 2 for theirs, ...
    ancestors: torch.Tensor | None = None  # [n, n] bool: [i, j] = node j is node i or one of its ancestors
    check: InitVar[bool] = True
    # where :meth:`extend` writes the next layer's ancestor rows (``ancestors`` is a view of it)
    store: "AncestorStore | None" = field(default=None, repr=False, compare=False)

    def __post_init__(self, check: bool):
        n = self.tokens.shape[0]
        if self.parents.shape != (n,) or self.path_probs.shape != (n,):
            raise ValueError("tokens, parents and path_probs must all have shape [n]")
        if check and n and bool((self.parents >= torch.arange(n, device=self.parents.device)).any()):
            raise ValueError("parents must come before their children (parents[i] < i)")

    @classmethod
    def empty(cls, device=None, dtype=torch.float32) -> "DraftTree":
        long = torch.empty(0, dtype=torch.long, device=device)
        return cls(long, long.clone(), torch.empty(0, dtype=dtype, device=device), long.clone(),
                   torch.empty(0, 0, dtype=torch.bool, device=device), check=False)

    @classmethod
    def first_layer(cls, tokens: torch.Tensor, path_probs: torch.Tensor, capacity: int = 0) -> "DraftTree":
        """The root's children: tokens [c] long, p̂ [c] float. ``capacity``: the nodes the pool
        is expected to reach as :meth:`extend` grows it (its ancestor store starts that large)."""
        c = tokens.shape[0]
        store = AncestorStore.with_capacity(max(capacity, c), tokens.device)
        store.filled = c
        return cls(tokens, torch.full((c,), -1, dtype=torch.long, device=tokens.device), path_probs,
                   ancestors=store.view(c), store=store, check=False)

    def extend(self, tokens: torch.Tensor, parents: torch.Tensor, path_probs: torch.Tensor) -> "DraftTree":
        """This tree plus c new nodes under EXISTING nodes: tokens [c] long, parents [c] long
        (each in [0, n)), p̂ [c] float. A new node's ancestor row is its parent's plus itself,
        written into the store's next rows (no copy of the n × n mask); depths are left to
        :meth:`depths` (a row sum of the ancestor mask), made on demand."""
        n, c = len(self), tokens.shape[0]
        store = self.store
        if store is None or store.filled != n:  # not the newest tree of its store (or none): a store of its own
            store = AncestorStore.holding(self.ancestor_mask(), 2 * (n + c))
        store.reserve(n + c)
        # a parent's row has no column >= n set; the new rows' own diagonal is set already
        store.buffer[n:n + c].logical_or_(store.buffer.index_select(0, parents))  # [c, capacity]
        store.filled = n + c
        return DraftTree(torch.cat([self.tokens, tokens]), torch.cat([self.parents, parents]),
                         torch.cat([self.path_probs, path_probs]), ancestors=store.view(n + c), store=store,
                         check=False)

    def subtree(self, keep: torch.Tensor) -> "DraftTree":
        """The nodes ``keep`` ([k] long, ascending, closed under parents), re-indexed."""
        remap = torch.full((len(self) + 1,), -1, dtype=torch.long, device=keep.device)  # slot 0: the root
        remap[keep + 1] = torch.arange(keep.shape[0], device=keep.device)
        return DraftTree(self.tokens[keep], remap[self.parents[keep] + 1], self.path_probs[keep],
                         None if self.depth is None else self.depth[keep], self.ancestor_mask()[keep][:, keep],
                         check=False)

    def to(self, device) -> "DraftTree":
        """The same tree on ``device`` (itself when it is there already)."""
        if self.tokens.device == torch.device(device):
            return self  # (no op: not even a no-op ``to``)
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return DraftTree(move(self.tokens), move(self.parents), self.path_probs, move(self.depth),
                         move(self.ancestors), check=False)

    @classmethod
    def from_paths(cls, paths, tokens_of_path, probs_of_path=None) -> "DraftTree":
        """Build a tree from root-to-node paths, e.g. ``[(0,), (0, 0), (1,)]`` (Medusa style).

        ``tokens_of_path(path) -> int`` gives each node's token; ``probs_of_path`` its p̂ (default 1).
        Every path's parent path must be listed before it.
        """
        index = {(): -1}
        tokens, parents, probs = [], [], []
        for path in paths:
            path = tuple(path)
            if path[:-1] not in index:
                raise ValueError(f"path {path} is listed before its parent {path[:-1]}")
            index[path] = len(tokens)
            parents.append(index[path[:-1]])
            tokens.append(int(tokens_of_path(path)))
            probs.append(float(probs_of_path(path)) if probs_of_path else 1.0)
        return cls(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                   torch.tensor(probs))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def expected_length(self) -> float:
        """E(A) = Σ p̂: the expected number of accepted draft tokens (without the bonus token). A host read."""
        return float(self.path_probs.sum())

    def depths(self) -> torch.Tensor:
        """[n] long: 1 for the root's children, 2 for theirs, ..."""
        if self.depth is None:
            object.__setattr__(self, "depth", self.ancestor_mask().sum(dim=1))
        return self.depth

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool: ``m[i, j]`` is True when node j is node i or one of its ancestors."""
        if self.ancestors is None:
            object.__setattr__(self, "ancestors", closure(self.parents))
        return self.ancestors

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root's child down to node i (inclusive)."""
        path, parents = [], self.parents.tolist()
        while i >= 0:
            path.append(i)
            i = parents[i]
        return path[::-1]

    def children(self) -> list[list[int]]:
        """children()[p + 1] lists the children of node p (index 0: the root's children)."""
        kids: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents.tolist()):
            kids[p + 1].append(i)
        return kids

    def choices(self) -> list[tuple[int, ...]]:
        """Each node as a root-to-node path of sibling ranks (Medusa's ``choices`` form)."""
        rank, kids = {}, self.children()
        for siblings in kids:
            for r, i in enumerate(siblings):
                rank[i] = r
        return [tuple(rank[j] for j in self.path_to(i)) for i in range(len(self))]

    def render(self, decode=None, accepted: list[int] | None = None) -> str:
        """An ASCII picture: one node a line with its token and p̂; accepted nodes marked ``*``."""
        decode = decode or (lambda t: str(t))
        accepted_set = set(accepted or [])
        kids, lines = self.children(), ["(root)"]

        def walk(parent: int, indent: str):
            siblings = kids[parent + 1]
            for k, i in enumerate(siblings):
                last = k == len(siblings) - 1
                mark = "*" if i in accepted_set else " "
                token = decode(int(self.tokens[i]))
                lines.append(f"{indent}{'└─' if last else '├─'}{mark}{token!r} p̂={float(self.path_probs[i]):.3f}")
                walk(i, indent + ("  " if last else "│ "))

        walk(-1, "")
        return "\n".join(lines)


@dataclass
class AncestorStore:
    """The ancestor mask of a pool that grows layer by layer, kept in one buffer.

    ``buffer`` [capacity, capacity] bool starts as the identity (every node is its own ancestor);
    rows ``[0, filled)`` hold the pool's nodes. A new layer writes only its own rows, so the
    trees made on the way keep valid views (``buffer[:n, :n]``) and no layer copies the n × n
    mask. Only the newest tree of a store may extend it (:meth:`DraftTree.extend` checks).
    """

    buffer: torch.Tensor  # [capacity, capacity] bool
    filled: int = 0

    @classmethod
    def with_capacity(cls, capacity: int, device) -> "AncestorStore":
        return cls(torch.eye(capacity, dtype=torch.bool, device=device))

    @classmethod
    def holding(cls, ancestors: torch.Tensor, capacity: int) -> "AncestorStore":
        """A store whose first ``n`` rows are ``ancestors`` [n, n] bool."""
        n = ancestors.shape[0]
        store = cls.with_capacity(max(capacity, n), ancestors.device)
        store.buffer[:n, :n] = ancestors
        store.filled = n
        return store

    def reserve(self, size: int) -> None:
        """Room for ``size`` nodes: a buffer twice as large (the filled block copied) when short."""
        capacity = self.buffer.shape[0]
        if size > capacity:
            bigger = torch.eye(max(size, 2 * capacity), dtype=torch.bool, device=self.buffer.device)
            bigger[:self.filled, :self.filled] = self.buffer[:self.filled, :self.filled]
            self.buffer = bigger

    def view(self, n: int) -> torch.Tensor:
        """[n, n] bool: the ancestor mask of the first ``n`` nodes."""
        return self.buffer[:n, :n]


def closure(parents: torch.Tensor) -> torch.Tensor:
    """[n] long parents (-1 = root) -> [n, n] bool ancestor mask (self included), by pointer
    doubling: after round r each row holds its nearest 2^r generations; ⌈log2(n + 1)⌉ rounds,
    no per-node Python loop."""
    n = parents.shape[0]
    device = parents.device
    up = torch.cat([torch.where(parents < 0, n, parents), torch.tensor([n], device=device)])  # [n + 1]; n: the root
    reach = torch.eye(n + 1, dtype=torch.bool, device=device)  # [n + 1, n + 1]
    reach[n, n] = False  # the root is nobody's node
    for _ in range(max(1, n.bit_length())):
        reach = reach | reach[up]
        up = up[up]
    return reach[:n, :n]
