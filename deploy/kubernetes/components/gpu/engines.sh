#!/usr/bin/env bash
# The engine cache: a volume that the Job specdec-build-engines fills once and every replica reads.
#   engines.sh build   (the Job; the cache mounted at /engines) `specdec build` the profile into its
#                      build_dir, then record which profile the finished build is for
#   engines.sh link    (each replica's init container; the cache at /engine-cache, the replica's
#                      own build folder at /engines) wait for that record, then link the build's
#                      checkpoints and engines into the replica's build folder
# Replicas cannot share one build folder: `specdec serve` keeps its state (read by the probes), its
# drain flag (read by every request), logs and rendered model repository there. A linked folder
# has the same path as the Job's, so each build step's marker (its command line) matches and the
# replica's own `specdec build` (docker/entrypoint.sh) only renders its repository.
set -euo pipefail

profile=${SPECDEC_PROFILE:?the profile file}
cache=${SPECDEC_ENGINE_CACHE:-/engine-cache}
build_dir=$(python3 -c 'import sys; from specdec.config import load_profile
print(load_profile(sys.argv[1]).build_path())' "$profile")
# the profile's digest: a build of an older version of it is not the one to serve
digest=$(sha256sum <"$profile" | cut -d' ' -f1)
record=built-from-profile.sha256

case ${1:-} in
    build)
        python3 -m specdec.cli build --profile "$profile"
        echo "$digest" >"$build_dir/$record"
        ;;
    link)
        cached=$cache/$(basename "$build_dir")
        until [[ -f $cached/$record && $(<"$cached/$record") == "$digest" ]]; do
            echo "waiting for the Job specdec-build-engines to build this profile into $cached"
            sleep 15
        done
        mkdir -p "$build_dir"
        for part in checkpoints engines; do
            if [[ -d $cached/$part ]]; then
                ln -sfn "$cached/$part" "$build_dir/$part"
            fi
        done
        echo "linked the build in $cached into $build_dir"
        ;;
    *)
        echo "usage: $0 build|link" >&2
        exit 2
        ;;
esac
