#!/usr/bin/env python3
"""Checks that every relative link and anchor in the repository's Markdown resolves.

    python3 tests/docs/check_links.py REPO_ROOT

Markdown files: `git ls-files` (tracked, and untracked ones git does not ignore), or, without git,
a walk of the tree that skips build*/, .git/, data/ and runs/. For every inline link [text](target),
image ![alt](target) and reference definition [label]: target that is not http(s) or mailto, the
file must exist relative to the Markdown file (a leading / means the repository root), and a
#anchor must name a heading of that file (GitHub's rule: lowercase, punctuation dropped except
hyphens, underscores and spaces, spaces to hyphens, repeated headings -1, -2, ...) or an explicit
<a id="..."> / <a name="...">. Links inside fenced code blocks and inline code spans are skipped.
Anchors into files that are not Markdown (GitHub's #L10 line anchors) are not checked.

Prints each broken link as FILE:LINE: target: why and exits 1 if there is any; else prints a
one-line summary and exits 0. Python 3 standard library only.
"""

import os
import re
import subprocess
import sys
import urllib.parse

SKIPPED_DIRS = {".git", "data", "runs"}
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ANCHOR = re.compile(r"""<a\s[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.I)
REFERENCE = re.compile(r"^ {0,3}\[((?:[^\]\\]|\\.)+)\]:[ \t]*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
ALLOWED_SCHEMES = ("http:", "https:", "mailto:")


def markdown_files(root):
    """Paths relative to root, sorted."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
             "--", "*.md"],
            check=True, capture_output=True).stdout.decode()
        files = [f for f in out.split("\0") if f and os.path.isfile(os.path.join(root, f))]
        return sorted(set(files))
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if d not in SKIPPED_DIRS and not d.startswith("build")]
        for name in filenames:
            if name.endswith(".md"):
                files.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(files)


def code_span_free(line):
    """The line with inline code spans (and backslash-escaped characters) blanked out, same length."""
    out = list(line)
    i = 0
    n = len(line)
    while i < n:
        c = line[i]
        if c == "\\" and i + 1 < n:
            out[i] = out[i + 1] = " "
            i += 2
            continue
        if c == "`":
            j = i
            while j < n and line[j] == "`":
                j += 1
            run = line[i:j]
            close = line.find(run, j)
            while close != -1 and close + len(run) < n and line[close + len(run)] == "`":
                close = line.find(run, close + len(run) + 1)
            if close == -1:
                i = j  # an unmatched run is literal text
                continue
            for k in range(i, close + len(run)):
                out[k] = " "
            i = close + len(run)
            continue
        i += 1
    return "".join(out)


def lines_outside_fences(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not m.group(2).strip():
            fence = None


def heading_text(raw):
    """What GitHub renders of a heading's inline Markdown: the text, without markup."""
    text = re.sub(r"!?\[((?:[^\]\\]|\\.)*)\]\([^)]*\)", r"\1", raw)  # links, images: their text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = text.replace("`", "")
    text = re.sub(r"(\*+)(.+?)\1", r"\2", text)  # emphasis with asterisks
    text = re.sub(r"\\(.)", r"\1", text)
    return text.strip()


def slug(text):
    """GitHub's anchor of a heading's text (before duplicates get their -1, -2 suffixes)."""
    text = text.strip().lower()
    return "".join(c for c in text if c.isalnum() or c in "-_ ").replace(" ", "-")


def anchors_of(text):
    """Every anchor a Markdown document defines."""
    anchors = set()
    seen = {}

    def add_heading(raw):
        base = slug(heading_text(raw))
        count = seen.get(base, 0)
        seen[base] = count + 1
        anchors.add(base if count == 0 else "%s-%d" % (base, count))

    previous = None  # the previous line, if it could be a setext heading's text
    for _, line in lines_outside_fences(text):
        for m in HTML_ANCHOR.finditer(line):
            anchors.add(m.group(1))
        m = ATX.match(line)
        if m:
            add_heading(re.sub(r"[ \t]+#+[ \t]*$|^#+[ \t]*$", "", m.group(2) or ""))
            previous = None
            continue
        if previous is not None and SETEXT.match(line):
            add_heading(previous.strip())
            previous = None
            continue
        stripped = line.strip()
        plain = (stripped and not stripped.startswith(("|", ">", "-", "*", "+", "<"))
                 and not re.match(r"^\d+[.)]\s", stripped) and not line.startswith("    "))
        previous = line if plain else None
    return anchors


def links_in_line(line):
    """(column, target) of every inline link or image in a line with its code spans blanked."""
    found = []
    for m in re.finditer(r"\]\(", line):
        # The link text must open with a [ on this line, brackets balanced in between.
        depth = 0
        k = m.start()
        opened = False
        while k >= 0:
            if line[k] == "]":
                depth += 1
            elif line[k] == "[":
                depth -= 1
                if depth == 0:
                    opened = True
                    break
            k -= 1
        if not opened:
            continue
        # The destination: <...>, or up to the parenthesis that closes it (nested ones balanced),
        # then an optional title.
        i = m.end()
        while i < len(line) and line[i] in " \t":
            i += 1
        if i < len(line) and line[i] == "<":
            close = line.find(">", i)
            if close == -1:
                continue
            target = line[i + 1:close]
        else:
            depth = 0
            j = i
            while j < len(line):
                c = line[j]
                if c == "(":
                    depth += 1
                elif c == ")":
                    if depth == 0:
                        break
                    depth -= 1
                elif c in " \t":
                    break
                j += 1
            if j >= len(line):
                continue  # not closed on this line
            target = line[i:j]
        found.append((k, target))
    return found


def check_target(root, source, target, anchor_cache):
    """Why `target`, linked from `source` (relative to root), does not resolve; None if it does."""
    if not target:
        return "empty link"
    if SCHEME.match(target):
        return None if target.lower().startswith(ALLOWED_SCHEMES) else "unsupported URL scheme"
    path, _, fragment = target.partition("#")
    path = urllib.parse.unquote(path.split("?", 1)[0])
    if path.startswith("/"):
        resolved = os.path.normpath(os.path.join(root, path.lstrip("/")))
    elif path:
        resolved = os.path.normpath(os.path.join(root, os.path.dirname(source), path))
    else:
        resolved = os.path.join(root, source)
    if not os.path.exists(resolved):
        return "no such file (%s)" % os.path.relpath(resolved, root)
    if not fragment:
        return None
    if os.path.isdir(resolved):
        resolved = os.path.join(resolved, "README.md")
        if not os.path.isfile(resolved):
            return "an anchor into a folder without a README.md"
    if not resolved.endswith(".md"):
        return None
    if resolved not in anchor_cache:
        with open(resolved, encoding="utf-8", errors="replace") as f:
            anchor_cache[resolved] = anchors_of(f.read())
    anchor = urllib.parse.unquote(fragment)
    if anchor in anchor_cache[resolved]:
        return None
    where = os.path.relpath(resolved, root)
    if anchor.lower() in anchor_cache[resolved]:
        return "no anchor '%s' in %s (anchors are lowercase: '%s')" % (anchor, where,
                                                                     anchor.lower())
    return "no heading or anchor '%s' in %s" % (anchor, where)


def check(root):
    """(broken links as 'FILE:LINE: target: why', files checked, links checked)."""
    root = os.path.abspath(root)
    broken = []
    checked = 0
    anchor_cache = {}
    files = markdown_files(root)
    for source in files:
        with open(os.path.join(root, source), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for number, line in lines_outside_fences(text):
            m = REFERENCE.match(line)
            targets = []
            if m:
                target = m.group(2)
                targets.append(target[1:-1] if target.startswith("<") else target)
            else:
                targets = [t for _, t in links_in_line(code_span_free(line))]
            for target in targets:
                if target.lower().startswith(ALLOWED_SCHEMES):
                    continue
                checked += 1
                why = check_target(root, source, target, anchor_cache)
                if why:
                    broken.append("%s:%d: %s: %s" % (source, number, target, why))
    return broken, len(files), checked


def main(argv):
    if len(argv) != 2:
        print("usage: check_links.py REPO_ROOT", file=sys.stderr)
        return 2
    if not os.path.isdir(argv[1]):
        print("check_links.py: %s is not a directory" % argv[1], file=sys.stderr)
        return 2
    broken, files, links = check(argv[1])
    for line in broken:
        print(line)
    if broken:
        print("%d of %d relative links broken in %d Markdown file(s)" % (len(broken), links, files))
        return 1
    print("all %d relative links and anchors resolve in %d Markdown file(s)" % (links, files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
