#!/usr/bin/env python3
"""Regenerates the CHECK lines of lit tests from what the CLI prints now (like MLIR's
generate-test-checks.py). Review the diff before committing: the new output becomes the spec.

  tests/scripts/update_checks.py build/meshfuse tests/lit/hostir/row_bias.mf [...]

Each file's first RUN line gives the command (`%meshfuse ... %s | FileCheck %s`); files with
--split-input-file get one CHECK-LABEL block per case (labelled by the `mesh @name` line), other
files one block after the fusion (labelled by the first line of the output)."""
import re
import shlex
import subprocess
import sys


def escape(line):
    return line.replace("[[", "{{\\[\\[}}").replace("]]", "{{\\]\\]}}")


def checks(output, label_re, prefix="CHECK"):
    lines, out, started = output.rstrip("\n").split("\n"), [], False
    for line in lines:
        if not started:
            if re.search(label_re, line):
                out.append(f"# {prefix}-LABEL: {escape(line.strip())}")
                started = True
            continue
        out.append(f"# {prefix}-NEXT: {escape(line)}")
    return out


def update(meshfuse, path):
    text = open(path).read()
    run = re.search(r"^# RUN: %meshfuse (.*?) %s \| FileCheck %s\s*$", text, re.M)
    if not run:
        sys.exit(f"{path}: no '# RUN: %meshfuse ... %s | FileCheck %s' line")
    args = shlex.split(run.group(1))
    split = "--split-input-file" in args
    args = [a for a in args if a != "--split-input-file"]
    body = "\n".join(l for l in text.split("\n") if not re.match(r"# CHECK", l))
    cases = body.split("# -----\n") if split else [body]
    result = []
    for case in cases:
        code = "\n".join(l for l in case.split("\n") if not l.startswith("# RUN"))
        proc = subprocess.run([meshfuse] + args + ["-"], input=code, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{path}: {proc.stderr}")
        label = r"mesh @" if split else r"\S"
        result.append(case.rstrip("\n") + "\n" + "\n".join(checks(proc.stdout, label)) + "\n")
    open(path, "w").write("# -----\n".join(result))


if __name__ == "__main__":
    for p in sys.argv[2:]:
        update(sys.argv[1], p)
