#!/usr/bin/env python3
"""Checks that tests/docs/check_links.py catches broken links and passes good ones.

    python3 tests/docs/check_links_test.py

Builds small trees of Markdown in a temporary directory (not a git repository, so the checker
walks it), runs the checker on them as the test suite does (a subprocess) and through its
functions, and fails unless every good link passes and every bad one is reported at its line.
Python 3 standard library only.
"""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check_links.py")
sys.path.insert(0, HERE)
import check_links  # noqa: E402

FENCE = "`" * 3

GOOD = {
    "README.md": """# Project

See [the guide](docs/guide.md), [its setup](docs/guide.md#set-up-run-and-test),
[a heading here](#a-heading-with-punctuation-outerconnections-and-a_key) and
[the second Notes](#notes-1). ![a plot](docs/plot.svg) [a folder](docs/) and
[a folder's README anchor](docs#guide). [Explicit](#custom-anchor) [Named](#old-name).
[External](https://example.com/x#y), [mail](mailto:someone@example.com).
[![badge](docs/plot.svg)](docs/guide.md#guide).
[A title](docs/guide.md "the guide") and [angle brackets](<docs/guide.md>).

## A heading, with punctuation: `outer.connections` and a_key

## Notes

## Notes

<a id="custom-anchor"></a>
<a name="old-name"></a>

`[not a link](missing.md)` in a code span, and ``[nor this](missing.md#x)`` either.

{fence}sh
[inside a fence](missing.md)
# not a heading
{fence}

[ref]: docs/guide.md#guide
""".format(fence=FENCE),
    "docs/guide.md": """# Guide

## Set-up, run and test

Setext heading
--------------

[back](../README.md#notes) [setext](#setext-heading) [root-relative](/README.md#project)
""",
    "docs/README.md": "# Guide\n",
    "docs/plot.svg": "<svg xmlns='http://www.w3.org/2000/svg'/>\n",
    "build-x/skipped.md": "[ignored: build folders are not walked](nowhere.md)\n",
    "runs/skipped.md": "[ignored](nowhere.md)\n",
}

# Each bad link, the line it is on in BAD_README and what the report must say.
BAD_README = """# Bad

[a missing file](docs/missing.md)
[a missing anchor](docs/guide.md#no-such-heading)
[a missing local anchor](#nowhere)
[the wrong case](#Bad)
![a missing image](docs/missing.svg)
[the second duplicate that is not there](#notes-2)

## Notes

## Notes

[ref]: docs/gone.md
"""
BAD = [
    (3, "docs/missing.md", "no such file"),
    (4, "docs/guide.md#no-such-heading", "no heading or anchor 'no-such-heading'"),
    (5, "#nowhere", "no heading or anchor 'nowhere'"),
    (6, "#Bad", "anchors are lowercase"),
    (7, "docs/missing.svg", "no such file"),
    (8, "#notes-2", "no heading or anchor 'notes-2'"),
    (14, "docs/gone.md", "no such file"),
]


def write_tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)


def run_checker(root):
    result = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
    return result.returncode, result.stdout


class SlugTest(unittest.TestCase):
    def test_githubs_rule(self):
        cases = {
            "Planning a run: `atoll plan`": "planning-a-run-atoll-plan",
            "Several connections per island: `outer.connections`":
                "several-connections-per-island-outerconnections",
            "Goodput under repeated failures: `atoll local --chaos`":
                "goodput-under-repeated-failures-atoll-local---chaos",
            "Measured here (2 cores, no GPU)": "measured-here-2-cores-no-gpu",
            "What atoll does, and what others do": "what-atoll-does-and-what-others-do",
            "Where DiLoCo matches the baseline: `micro`, 45 tokens per parameter, 300 rounds":
                "where-diloco-matches-the-baseline-micro-45-tokens-per-parameter-300-rounds",
            "keys like `outer.sync_every`": "keys-like-outersync_every",
            "**Bold** and [a link](x.md)": "bold-and-a-link",
        }
        for heading, anchor in cases.items():
            self.assertEqual(check_links.slug(check_links.heading_text(heading)), anchor, heading)

    def test_duplicates_are_numbered(self):
        anchors = check_links.anchors_of("# A\n\n## A\n\n### A\n")
        self.assertEqual(anchors, {"a", "a-1", "a-2"})

    def test_headings_in_fences_do_not_count(self):
        anchors = check_links.anchors_of("# Real\n\n%s\n# comment\n%s\n" % (FENCE, FENCE))
        self.assertEqual(anchors, {"real"})


class CheckerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        write_tree(self.root, GOOD)

    def tearDown(self):
        self.tmp.cleanup()

    def test_good_links_pass(self):
        rc, out = run_checker(self.root)
        self.assertEqual(rc, 0, out)
        self.assertIn("resolve", out)

    def test_every_bad_link_is_reported_at_its_line(self):
        write_tree(self.root, {"bad/README.md": BAD_README, "bad/docs/guide.md": "# Guide\n"})
        rc, out = run_checker(self.root)
        self.assertEqual(rc, 1, out)
        reported = [line for line in out.splitlines() if line.startswith("bad/")]
        for number, target, why in BAD:
            matching = [line for line in reported
                        if line.startswith("bad/README.md:%d: %s: " % (number, target))]
            self.assertEqual(len(matching), 1, "line %d (%s) not reported once:\n%s"
                             % (number, target, out))
            self.assertIn(why, matching[0])
        self.assertEqual(len(reported), len(BAD), out)

    def test_a_broken_anchor_after_a_heading_is_renamed(self):
        # The mistake this check exists for: a section moves or is renamed, its links stay.
        with open(os.path.join(self.root, "docs/guide.md"), encoding="utf-8") as f:
            text = f.read()
        with open(os.path.join(self.root, "docs/guide.md"), "w", encoding="utf-8") as f:
            f.write(text.replace("## Set-up, run and test", "## Setting up"))
        rc, out = run_checker(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("README.md:3: docs/guide.md#set-up-run-and-test: no heading or anchor", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
