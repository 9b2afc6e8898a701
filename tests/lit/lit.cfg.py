# lit configuration: golden-IR tests of the CLI (`meshfuse print|opt|dump ...` | FileCheck).
import os
import lit.formats

config.name = "meshfuse"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mf", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.meshfuse_bin_dir, "tests", "lit")
config.excludes = ["lit.cfg.py", "lit.site.cfg.py.in", "Inputs"]
config.substitutions.append(("%meshfuse", os.path.join(config.meshfuse_bin_dir, "meshfuse")))
config.substitutions.append(("FileCheck", config.filecheck))
config.substitutions.append(("%srcroot", config.meshfuse_source_dir))
config.environment["OPENBLAS_NUM_THREADS"] = "1"
