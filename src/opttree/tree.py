"""DraftTree: the tokens a drafter proposes, as a tree in topological order.

Glossary (see DESIGN.md): the *root* is the last committed token, not stored as a node; node i
holds ``tokens[i]``, hangs under ``parents[i]`` (-1 = the root) and has path probability
``path_probs[i]`` = p̂, the product of the draft probabilities on the path root→i. Parents always
come before their children (``parents[i] < i``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftTree:
    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long, -1 = child of the root
    path_probs: torch.Tensor  # [n] float, p̂

    def __post_init__(self):
        n = self.tokens.shape[0]
        if self.parents.shape != (n,) or self.path_probs.shape != (n,):
            raise ValueError("tokens, parents and path_probs must all have shape [n]")
        if n and bool((self.parents >= torch.arange(n, device=self.parents.device)).any()):
            raise ValueError("parents must come before their children (parents[i] < i)")

    @classmethod
    def empty(cls, device=None) -> "DraftTree":
        long = torch.empty(0, dtype=torch.long, device=device)
        return cls(long, long.clone(), torch.empty(0, device=device))

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
        """E(A) = Σ p̂: the expected number of accepted draft tokens (without the bonus token)."""
        return float(self.path_probs.sum())

    def depths(self) -> torch.Tensor:
        """[n] long: 1 for the root's children, 2 for theirs, ..."""
        depth = [0] * len(self)
        for i, p in enumerate(self.parents.tolist()):
            depth[i] = 1 if p < 0 else depth[p] + 1
        return torch.tensor(depth, dtype=torch.long, device=self.tokens.device)

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool: ``m[i, j]`` is True when node j is node i or one of its ancestors."""
        n = len(self)
        mask = torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                mask[i] |= mask[p]
        return mask

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
