"""Lab 13 (memory per rank: ZeRO, fully sharded data parallelism and activation checkpointing): the exercises'
answers for the contract every exercise keeps (``CONTRACT``, tests/test_contract.py) and their typical mistakes
(``MISTAKES``). The lesson's own tests are tests/test_sharded_dp.py."""

from conftest import Answers, Mistake, Reference

from labkit import sharded_dp

SPLIT = {"dp": (1, 1, 1), "zero1": (1, 1, 0), "zero2": (1, 0, 0), "zero3": (0, 0, 0)}  # 1: kept whole on each rank


def right_bytes(psi, ranks, stage):
    whole = SPLIT[stage]
    return {kind: psi * b / (1 if keep else ranks) for kind, b, keep in zip(("parameters", "gradients", "optimizer"),
                                                                            (2, 2, 12), whole)}


def _edited(**change):
    """The right answer with some kinds' bytes per parameter or split changed: a typical mistake."""
    def answer(psi, ranks, stage):
        out = right_bytes(psi, ranks, stage)
        for kind, fn in change.items():
            out[kind] = fn(psi, ranks, stage, out[kind])
        return out
    return answer


CONTRACT = {
    "bytes_per_rank": Answers(
        right_bytes, _edited(gradients=lambda psi, ranks, stage, b: b * 3),
        passes="✔ bytes per rank: all 14 checks passed",
        references=(Reference(sharded_dp.memory_per_rank, "labkit.sharded_dp.memory_per_rank"),)),
}
MISTAKES = {  # each named by its own diagnosis, with a hint about it and no step (tests/test_contract.py)
    "bytes_per_rank": (
        Mistake(_edited(optimizer=lambda psi, ranks, stage, b: psi * 12), says="zero1: optimizer: .*the whole optimizer on "
                "one rank", hint="stage 1 splits the optimizer over the ranks"),
        Mistake(_edited(parameters=lambda psi, ranks, stage, b: psi * 2 / ranks), says="dp: parameters: .*1/64 of the "
                "parameters", hint="plain data parallelism keeps the whole parameters on every rank"),
        Mistake(_edited(parameters=lambda psi, ranks, stage, b: 2 * b), says="4 bytes per value", hint="fp16"),
        Mistake(_edited(optimizer=lambda psi, ranks, stage, b: b * 8 / 12), says="8 bytes per parameter of state",
                hint="master copy of the weights"),
    ),
}
