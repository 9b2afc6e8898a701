"""Do the ranks agree? A check run before ranks communicate, for inputs that differ per rank.

Ranks that disagree on what they run (one passes an f16 input, or a local shape the others do not
have) would enter different collectives, or one would raise while the others wait, until
MESHFUSE_COMM_TIMEOUT aborts the job. ``check_same(what, fields, team)`` instead raises the same
``meshfuse.ValueError`` on every rank of `team`, naming the ranks that differ and how.

Cost: one allgather of two int64 per rank (a digest and a length) when the ranks agree; only when
they do not, a second allgather carries each rank's description for the message.
"""

from __future__ import annotations

import hashlib

import numpy as np

from . import _C

__all__ = ["check_same"]


def _encode(fields) -> bytes:
    def clean(s):
        return str(s).replace("\t", " ").replace("\n", " ")

    return "\n".join(f"{clean(label)}\t{clean(value)}" for label, value in fields).encode()


def _decode(data: bytes) -> dict:
    return dict(line.split("\t", 1) for line in data.decode().split("\n") if line)


def _ranks(ranks: list) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def check_same(what: str, fields: list, team: list | None = None) -> None:
    """Collective over `team` (global ranks; default the world): raises meshfuse.ValueError on
    every member unless every member passes the same `fields`, a list of (label, value) strings
    ("input 0 (%x)", "f32[8, 16] ..."). A rank that already failed passes [("error", message)]:
    the others then fail with it instead of waiting for that rank."""
    data = _encode(fields)
    digest = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)
    heads = _C.allgather_int64([digest, len(data)], team)
    if all(h[0] == heads[0][0] for h in heads):
        return
    words = (max(h[1] for h in heads) + 7) // 8
    padded = np.zeros(words * 8, dtype=np.uint8)
    padded[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    bodies = _C.allgather_int64(padded.view(np.int64).tolist(), team)
    members = team if team is not None else list(range(len(heads)))
    per_rank = {r: _decode(np.asarray(b, dtype=np.int64).view(np.uint8)[:h[1]].tobytes())
                for r, b, h in zip(members, bodies, heads)}
    raise _C.ValueError(f"{what}: {describe(per_rank)}")


def describe(per_rank: dict) -> str:
    """The disagreement of {rank: {label: value}}, against the most common description (ties: the
    one of the lowest rank): 'input 0 (%x) is A on rank 1 but B on ranks 0, 2'."""
    groups: dict = {}
    for r, fields in per_rank.items():
        groups.setdefault(tuple(fields.items()), []).append(r)
    reference = max(groups, key=lambda k: (len(groups[k]), -min(groups[k])))
    ref, ref_ranks = dict(reference), groups[reference]
    failed = [f"{_ranks(ranks)} failed: {dict(k)['error']}" for k, ranks in groups.items() if "error" in dict(k)]
    if failed:  # the ranks that raised are the news, not the fields the others passed
        return "; ".join(failed)
    diffs = []
    for key, ranks in groups.items():
        if key == reference:
            continue
        fields = dict(key)
        for label in dict.fromkeys([*ref, *fields]):
            if fields.get(label) != ref.get(label):
                diffs.append(f"{label} is {fields.get(label, '(missing)')} on {_ranks(ranks)} but "
                             f"{ref.get(label, '(missing)')} on {_ranks(ref_ranks)}")
    return "the ranks disagree: " + "; ".join(diffs)
