"""Python threads calling one FusionDefinitionWrapper at once: each thread's outputs are those of
its own inputs (numpy is the oracle). The C++ run releases the GIL, so calls really overlap."""

import threading

import numpy as np

from meshfuse import DTensor, FusionDefinitionWrapper, Replicate, distribute_tensor

import helpers as H

THREADS, CALLS, HIDDEN = 3, 150, 256


def test_threads_sharing_one_wrapper_get_their_own_results(rng, world_mesh):
    # Replicated inputs: no collective, so the threads' calls need not be ordered across ranks
    # (nor does the input check, which is a collective: off here).
    fdw = FusionDefinitionWrapper(lambda fd: fd.add_output(fd.ops.linear(fd.define_tensor([-1, HIDDEN]),
                                                                         fd.define_tensor([HIDDEN, HIDDEN]))),
                                  check_inputs="never")
    w = H.randn(rng, HIDDEN, HIDDEN)
    wd = distribute_tensor(w, world_mesh, [Replicate()])
    # Each thread its own rows count, so that a call run with another thread's input would also
    # fail on its shape, and its own values.
    xs = [np.full((32 * (t + 1), HIDDEN), float(t + 1), dtype=np.float32) for t in range(THREADS)]
    wrong, errors = [], []

    def worker(t):
        try:
            want = xs[t].astype(np.float64) @ w.T
            for _ in range(CALLS):
                (out,) = fdw([DTensor.from_local(xs[t], world_mesh, [Replicate()]), wd])
                if not np.allclose(out.to_local(), want, rtol=1e-4, atol=1e-3):
                    wrong.append(t)
        except Exception as e:  # noqa: BLE001 (reported below, on the main thread)
            errors.append(repr(e))

    timer_inputs = [DTensor.from_local(xs[0], world_mesh, [Replicate()]), wd]
    call, locals_ = fdw._call_for(timer_inputs)  # the benchmark's C++-timed runs, alongside

    def timer():
        try:
            for _ in range(CALLS):
                assert call.prepared.time_run(locals_, 1) > 0
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)] + [threading.Thread(target=timer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []
    assert fdw.cache_size == THREADS  # one program per rows count, compiled once each
