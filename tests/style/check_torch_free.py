#!/usr/bin/env python3
"""The torch-free libraries stay torch-free: no object in them defines or uses a symbol of libtorch
(at::, c10::, torch::). They are what the Python package's core links without libtorch (src/
CMakeLists.txt says which); one include of a torch header, direct or through an inner/ header,
would make every torch 2.x release but one fail to load it.

usage: check_torch_free.py LIB.a...            every library torch-free
       check_torch_free.py --expect-torch LIB.a  the check itself: a torch library is caught
"""
import re
import subprocess
import sys

TORCH = re.compile(r"\b(at|c10|torch|caffe2)::")


def torch_symbols(lib):
    out = subprocess.run(["nm", "-C", lib], capture_output=True, text=True, check=True).stdout
    return sorted({line.split(" ", 2)[-1] for line in out.splitlines() if TORCH.search(line)})


def main(argv):
    expect_torch = argv[:1] == ["--expect-torch"]
    libs = argv[1:] if expect_torch else argv
    if not libs:
        print(__doc__)
        return 2
    failed = False
    for lib in libs:
        found = torch_symbols(lib)
        if expect_torch:
            if not found:
                print(f"{lib}: no torch symbol found in a library that uses libtorch")
                failed = True
        elif found:
            print(f"{lib}: {len(found)} torch symbol(s), e.g.")
            for s in found[:5]:
                print(f"  {s}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
