#!/usr/bin/env bash
# On the GPU machine, from the repository root: keep the pieces of one carried piece folder (made by
# benchmarks/gpu_host/stack_pieces.sh) under STAGE (default /opt/vox-stage, kept while the host lives), rebuild
# every file whose pieces are all there (checked against the manifest's sha256), and install each part of the stack
# (part1.tar.xz, part2/, part3/) once all its files are rebuilt, with the bundle's install.sh (INSTALL, default
# .gpu/install.sh). Prints the environment to use, as install.sh does:
#   eval "$(bash benchmarks/gpu_host/stack_stage.sh .gpu/pieces/01)"
set -euo pipefail
folder=${1:?usage: stack_stage.sh PIECE_FOLDER}
stage=${STAGE:-/opt/vox-stage} install=${INSTALL:-.gpu/install.sh}
mkdir -p "$stage/pieces" "$stage/files" "$stage/stack"
(cd "$folder" && find . -type f -name '*.piece-*' | sed 's|^\./||') | while read -r piece; do
  mkdir -p "$stage/pieces/$(dirname "$piece")"
  cp "$folder/$piece" "$stage/pieces/$piece"
done
# rebuild complete files
while read -r rel n sum; do
  [ -e "$stage/files/$rel" ] && continue
  have=$( (ls "$stage/pieces/$rel".piece-* 2> /dev/null || true) | wc -l)
  [ "$have" -eq "$n" ] || continue
  mkdir -p "$stage/files/$(dirname "$rel")"
  cat "$stage/pieces/$rel".piece-* > "$stage/files/$rel.tmp"
  if [ "$(sha256sum "$stage/files/$rel.tmp" | cut -d' ' -f1)" != "$sum" ]; then
    echo "stack_stage.sh: $rel does not match its sha256" >&2; exit 3
  fi
  mv "$stage/files/$rel.tmp" "$stage/files/$rel"
done < "$folder/manifest.txt"
# a part goes into the stack folder only whole and after the parts before it (install.sh installs any part it
# finds there, once, and part 2 only after part 1)
for part in $(cut -d' ' -f1 "$folder/manifest.txt" | cut -d/ -f1 | sort -u); do
  [ -e "$stage/stack/$part" ] && continue
  missing=$(cut -d' ' -f1 "$folder/manifest.txt" | grep -E "^$part(/|$)" | while read -r rel; do
    [ -e "$stage/files/$rel" ] || echo "$rel"; done)
  [ -z "$missing" ] || break
  cp -r "$stage/files/$part" "$stage/stack/$part"
done
echo "staged: $(ls "$stage/stack" | tr '\n' ' ')" >&2
bash "$install" "$stage/stack"
