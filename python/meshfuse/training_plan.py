"""The plan of a whole training step: ``fdw.plan(inputs, wrt=[...], optimizer=opt)``.

A training step runs several programs — the forward (extended with what backward needs), the
backward and, with an optimizer, one fused update per parameter group — each compiled like any
call. TrainingPlan shows them together: every collective says which program (``phase``) runs it.
"""

from __future__ import annotations


class PhaseCollective:
    """A collective of one of the step's programs: ``phase`` ("forward", "backward" or
    "optimizer"), then the fields of Plan.collectives() entries (kind, team, bytes, ...)."""

    __slots__ = ("phase", "_c")

    def __init__(self, phase: str, c):
        self.phase, self._c = phase, c

    def __getattr__(self, name):
        return getattr(self._c, name)

    def __repr__(self):
        return f"{self.phase}: {self._c!r}"


class TrainingPlan:
    """Plans of the step's programs, in the order they run: ``programs`` is [(phase, Plan)]."""

    def __init__(self, programs: list):
        self.programs = programs
        self.forward = programs[0][1]
        self.backward = programs[1][1]
        self.optimizer = [p for phase, p in programs if phase == "optimizer"]
        self.saves = self.backward.saves

    def collectives(self, rank: int | None = None) -> list:
        """Every program's collectives, in execution order, each with its ``phase``."""
        return [PhaseCollective(phase, c) for phase, p in self.programs for c in p.collectives(rank)]

    def host_ir(self, rank: int | None = None) -> str:
        """Each program's host IR (for `rank`, default this rank), headed by its phase."""
        return "".join(f"# ----- {phase} program\n{p.host_ir(rank)}" for phase, p in self.programs)

    def __repr__(self):
        return f"TrainingPlan({[(phase, [c.kind for c in p.collectives()]) for phase, p in self.programs]})"
