"""Copies the installed files of the pure-Python packages the GPU check needs (by their
RECORD) into a folder: python stage.py DEST. Compiled ones come as Python 3.12 wheels."""
import csv, pathlib, shutil, sys, importlib.metadata as md
dst = pathlib.Path(sys.argv[1]); dst.mkdir(parents=True, exist_ok=True)
names = """ipykernel ipython ipython-pygments-lexers jupyter-client jupyter-core nbclient nbformat traitlets tornado comm
matplotlib-inline prompt-toolkit jedi parso stack-data executing asttokens pure-eval pexpect ptyprocess wcwidth platformdirs
nest-asyncio2 ipywidgets jupyterlab-widgets fastjsonschema jsonschema jsonschema-specifications referencing lark
opentelemetry-api opentelemetry-sdk opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-common
opentelemetry-proto opentelemetry-semantic-conventions opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-common
googleapis-common-protos clusterscope flask blinker itsdangerous torchdata torch-checkpointing datasets dill multiprocess
tyro docstring-parser typeguard typing-inspection spmd-types torchtitan decorator""".split()
missing = []
for n in names:
    try:
        d = md.distribution(n)
    except md.PackageNotFoundError:
        missing.append(n); continue
    base = pathlib.Path(d._path).parent
    for f in d.files or []:
        s = str(f)
        if s.startswith("..") or "__pycache__" in s or s.endswith(".pyc"):
            continue
        src = base / f
        if src.is_file():
            out = dst / f
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)
        if s.endswith(".so") and "abi3" not in s:
            print("compiled (3.11) in", n, s)
print("missing:", missing)
