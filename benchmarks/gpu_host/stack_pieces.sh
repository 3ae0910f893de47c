#!/usr/bin/env bash
# On this machine: cut the offline vLLM stack (SRC, as ../shared/gpu-stack/build.sh made it: part1.tar.xz, part2/,
# part3/) into piece folders of at most MAX_MB each under DEST (DEST/01, DEST/02, ...), so that each copy to a GPU
# host that limits one transfer carries one piece folder beside the working tree instead of a 60 MiB part. Files
# larger than MAX_MB are split; every folder holds a copy of the manifest
# (original path, piece count, sha256). On the GPU machine `benchmarks/gpu_host/stack_stage.sh DEST/NN` collects the
# pieces and installs each part once it is complete.
#   bash benchmarks/gpu_host/stack_pieces.sh .gpu/stack .gpu/pieces [MAX_MB]
set -euo pipefail
src=${1:?usage: stack_pieces.sh SRC DEST [MAX_MB]} dest=${2:?usage: stack_pieces.sh SRC DEST [MAX_MB]}
max=${MAX_BYTES:-$(( ${3:-12} * 1000 * 1000 ))}  # MAX_BYTES: tests
rm -rf "$dest"; mkdir -p "$dest/.cut"
manifest=$dest/.cut/manifest.txt; : > "$manifest"
# 1. every file as pieces of at most max bytes (a smaller file is its own single piece)
(cd "$src" && find . -type f | sed 's|^\./||' | sort) | while read -r rel; do
  mkdir -p "$dest/.cut/$(dirname "$rel")"
  split -b "$max" -d -a 2 "$src/$rel" "$dest/.cut/$rel.piece-"
  n=$(ls "$dest/.cut/$rel".piece-* | wc -l)
  echo "$rel $n $(sha256sum "$src/$rel" | cut -d' ' -f1)" >> "$manifest"
done
# 2. pieces into folders, first fit in path order, each under max bytes
folder=1 used=0
(cd "$dest/.cut" && find . -type f -name '*.piece-*' | sed 's|^\./||' | sort) | while read -r piece; do
  size=$(stat -c %s "$dest/.cut/$piece")
  if [ "$used" -gt 0 ] && [ $(( used + size )) -gt "$max" ]; then folder=$(( folder + 1 )); used=0; fi
  target=$dest/$(printf %02d "$folder")
  mkdir -p "$target/$(dirname "$piece")"
  mv "$dest/.cut/$piece" "$target/$piece"
  used=$(( used + size ))
done
for d in "$dest"/[0-9]*; do cp "$manifest" "$d/manifest.txt"; done
rm -rf "$dest/.cut"
du -sh "$dest"/[0-9]* | sed 's|^|piece folder |'
