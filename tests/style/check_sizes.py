#!/usr/bin/env python3
"""Files and functions that fit one idea: no source file of the code folders over MAX_FILE lines,
no function over MAX_FUNCTION lines (from its signature's first line to its closing brace).

  check_sizes.py ROOT            checks compression/ inner/ outer/ src/ under ROOT
  check_sizes.py --self-test     checks the checker on code written here (it must catch both)

Functions are found by their braces: comments, strings and character literals are blanked first;
a brace opens a function when it follows a closing parenthesis (with qualifiers, a trailing
return type or a constructor's initializer list between) outside any other function, at namespace
or class level. Lambdas and control blocks inside a function count as its lines.
"""
import bisect
import os
import re
import subprocess
import sys
import tempfile

MAX_FILE = 600
MAX_FUNCTION = 80
CODE_FOLDERS = ("compression", "inner", "outer", "src")
EXTENSIONS = (".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp")
CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else)\b")


def blank(text):
    """Comments, strings and character literals as spaces (newlines kept, so lines still count)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of every function defined outside another function."""
    code = blank(text)
    # Preprocessor lines say nothing about braces.
    code = re.sub(r"(?m)^[ \t]*#.*(\\\n.*)*$", lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
    newlines = [i for i, c in enumerate(code) if c == "\n"]

    def line_at(offset):
        return bisect.bisect_left(newlines, offset) + 1

    found, stack = [], []  # stack of (kind, first line, name)
    head_start = 0  # where the text before the next brace or semicolon began
    for pos, c in enumerate(code):
        if c not in "{};":
            continue
        head = code[head_start:pos]
        head_offset = head_start
        head_start = pos + 1
        if c == ";":
            continue
        if c == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "fn":
                    found.append((name, first, line_at(pos)))
            continue
        # Access labels are not part of a signature.
        label = re.match(r"\s*((public|private|protected)\s*:(?!:))?\s*", head)
        head_offset += label.end()
        stripped = head[label.end():].strip()
        kind, name = "other", ""
        if not any(k == "fn" for k, _, _ in stack):
            before_paren = stripped.split("(")[0]
            if re.search(r"\b(namespace|extern)\b", stripped) and "(" not in stripped:
                kind = "ns"
            elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", stripped):
                kind = "class"
            else:
                m = re.search(r"([~\w:<>]+)\s*\([^;]*\)\s*(const|override|final|noexcept|mutable|"
                              r"->[^{]*|:[^{]*|\s)*$", stripped, re.S)
                if m and not CONTROL.search(before_paren) and "=" not in before_paren:
                    kind, name = "fn", m.group(1)
        stack.append((kind, line_at(head_offset), name))
    return found


def check_file(path, rel):
    problems = []
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if lines > MAX_FILE:
        problems.append(f"{rel}: {lines} lines (at most {MAX_FILE}: split it where it holds two ideas)")
    for name, start, end in functions(text):
        if end - start + 1 > MAX_FUNCTION:
            problems.append(f"{rel}:{start}: {name} is {end - start + 1} lines (at most {MAX_FUNCTION}: "
                            "name its steps)")
    return problems


def source_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", *CODE_FOLDERS], capture_output=True,
                             text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
        for folder in CODE_FOLDERS:
            for d, _, files in os.walk(os.path.join(root, folder)):
                out += [os.path.relpath(os.path.join(d, f), root) for f in files]
    return sorted(f for f in out if f.endswith(EXTENSIONS) and os.path.exists(os.path.join(root, f)))


def self_test():
    long_body = "\n".join(f"  x += {i};" for i in range(MAX_FUNCTION))
    sample = (
        "namespace a {\n"
        "// a comment with a brace { and a string \"}\"\n"
        "int Short(int x) {\n  return x;\n}\n"
        f"int TooLong(int x) {{\n{long_body}\n  return x;\n}}\n"
        "class C {\n public:\n  C(int v) : v_(v) {\n    if (v) {\n    }\n  }\n  int v_;\n};\n"
        "}  // namespace a\n")
    found = {name: end - start + 1 for name, start, end in functions(sample)}
    assert found.get("Short") == 3, found
    assert found.get("TooLong") == MAX_FUNCTION + 3, found
    assert found.get("C") == 4, found
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "src"))
        with open(os.path.join(d, "src", "a.cc"), "w") as f:
            f.write(sample + "\n" * MAX_FILE)
        problems = check_file(os.path.join(d, "src", "a.cc"), "src/a.cc")
    assert any("TooLong" in p for p in problems), problems
    assert any(p.startswith("src/a.cc: ") for p in problems), problems
    assert not any("Short" in p for p in problems), problems
    print("check_sizes self-test: the checker catches a long function and a long file")
    return 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = sys.argv[1]
    files = source_files(root)
    problems = []
    for rel in files:
        problems += check_file(os.path.join(root, rel), rel)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} size problem(s) in {len(files)} files")
        return 1
    print(f"{len(files)} files: none over {MAX_FILE} lines, no function over {MAX_FUNCTION} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
