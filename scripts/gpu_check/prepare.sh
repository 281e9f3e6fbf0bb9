#!/usr/bin/env bash
# Builds .devpkg/ (git-ignored, < 64 MiB): what the GPU check needs on a machine with Python 3.12
# and its own CUDA torch but nothing else of ours, and no network. Run here, from the repo root:
#   scripts/gpu_check/prepare.sh     then carry .devpkg and run `bash .devpkg/run.sh` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
out=.devpkg; tmp=$(mktemp -d)
mkdir -p $out; grep -qx "/.devpkg/" .git/info/exclude 2>/dev/null || echo "/.devpkg/" >> .git/info/exclude
plat="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  plat="$plat --platform $p"; done
# compiled packages, for Python 3.12 (the rest are pure Python and come from our venv)
$PY -m pip download -q $plat -d $tmp torchmonarch==0.7.0 torchft==0.2.0 pyzmq==27.3.0 \
  "$(grep -i '^rpds-py==' constraints.txt)" "$(grep -i '^py-spy==' constraints.txt)" "$(grep -i '^xxhash==' constraints.txt)"
cp $tmp/torchft-*.whl $tmp/pyzmq-*.whl $tmp/rpds_py-*.whl $tmp/py_spy-*.whl $tmp/xxhash-*.whl $out/
# torchmonarch's wheel is 93 MB: its 274 MB Rust library travels xz-compressed (38 MB)
(cd $tmp && mkdir m && cd m && unzip -q ../torchmonarch-*.whl 'monarch/*' 'torchmonarch-*.dist-info/*' \
  && tar cf - --exclude='monarch/_rust_bindings*.so' monarch torchmonarch-*.dist-info | xz -6 -T2 > "$OLDPWD/$out/monarch_rest.tar.xz" \
  && xz -9 -T2 -c monarch/_rust_bindings*.so > "$OLDPWD/$out/rb.so.xz")
$PY scripts/gpu_check/stage.py $tmp/site
rm -rf $tmp/site/jedi/third_party
(cd $tmp/site && tar cf - . | xz -6 -T2 > "$OLDPWD/$out/devsite.tar.xz")
cp scripts/gpu_check/run.sh scripts/gpu_check/sitecustomize.py $out/
rm -rf $tmp; du -sh $out
