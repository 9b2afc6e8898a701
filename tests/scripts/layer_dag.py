#!/usr/bin/env python3
"""Proves the layer DAG (cmake/MeshfuseLayers.cmake) with the build's real compile commands.

For every layer L, a scratch file compiled exactly as L's own sources are (its command from
compile_commands.json, -fsyntax-only) must compile when it includes a header of L or of a layer
below, and must fail with "No such file or directory" when it includes a header of a layer above
(internal headers under src/, and the public headers under include/meshfuse that a higher layer
owns). A layer whose upward include compiled would be a hole in the architecture.

Usage: layer_dag.py BUILD_DIR
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

LAYERS = ["ir", "autodiff", "propagation", "decompose", "lower", "codegen", "runtime", "driver"]
# One header per layer: an internal one (src/<layer>/) and, where the layer owns any, a public one.
INTERNAL = {
    "ir": "ir/shape_inference.h", "autodiff": "autodiff/grad_context.h",
    "propagation": "propagation/sharding.h", "decompose": "decompose/resharding_steps.h",
    "lower": "lower/host_ir.h", "codegen": "codegen/kernel_ir.h", "runtime": "runtime/backend.h",
    "driver": "driver/backends.h",
}
PUBLIC = {"ir": "meshfuse/ir/fusion.h", "autodiff": "meshfuse/autodiff.h",
          "runtime": "meshfuse/communicator.h", "driver": "meshfuse/executor.h"}


def command_for(entries, layer, scratch):
    """The compile command of one of `layer`'s sources, turned into a syntax check of `scratch`."""
    for e in entries:
        if f"/src/{layer}/" in e["file"] and "/llvm/" not in e["file"]:
            args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
            out, skip = [], 0
            for i, a in enumerate(args):
                if skip:
                    skip -= 1
                    continue
                if a in ("-o", "-MF", "-MT", "-MQ"):
                    skip = 1
                    continue
                if a in ("-c", "-MD", "-MMD") or a == e["file"] or a.endswith(os.path.basename(e["file"])):
                    continue
                out.append(a)
            # ccache (the launcher) is not needed for a syntax check
            while out and ("ccache" in out[0] or out[0].endswith("cmake") or out[0] in ("-E", "env")
                           or out[0].startswith("CCACHE_")):
                out.pop(0)
            return out + ["-fsyntax-only", scratch], e["directory"]
    raise SystemExit(f"no compile command for a source of layer {layer}")


def main():
    build = sys.argv[1]
    entries = json.load(open(os.path.join(build, "compile_commands.json")))
    failures = checks = 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = os.path.join(tmp, "probe.cpp")
        for li, layer in enumerate(LAYERS):
            probes = []
            for mi, other in enumerate(LAYERS):
                # Own layer, the one just below, the bottom; the one just above and the top.
                if mi in (li, li - 1, 0, li + 1, len(LAYERS) - 1):
                    probes.append((other, INTERNAL[other], mi <= li))
                    if other in PUBLIC:
                        probes.append((other, PUBLIC[other], mi <= li))
            for other, header, allowed in probes:
                with open(scratch, "w") as f:
                    f.write(f'#include "{header}"\n')
                cmd, cwd = command_for(entries, layer, scratch)
                r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
                checks += 1
                if allowed and r.returncode != 0:
                    failures += 1
                    print(f"FAIL {layer} cannot include {header} of {other}, a layer it stands on:\n{r.stderr[:2000]}")
                elif not allowed and (r.returncode == 0 or "No such file or directory" not in r.stderr):
                    failures += 1
                    why = "it compiled" if r.returncode == 0 else r.stderr[:2000]
                    print(f"FAIL {layer} includes {header} of the higher layer {other}: {why}")
                else:
                    print(f"ok   {layer:12} {'may' if allowed else 'may not'} include {header}")
    print(f"{checks} checks, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
