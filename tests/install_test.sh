#!/usr/bin/env bash
# Installs the build into a scratch prefix and builds a program against it
# twice, as a user would: with find_package(refit) (tests/consumer) and with
# pkg-config. Fails when a public header reaches into src/, when the package
# config or the .pc file misses a dependency, or when the command is not
# installed. Usage: tests/install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
work=$(mktemp -d /tmp/refit-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/refit" || { echo "install_test: bin/refit missing" >&2; exit 1; }
"$prefix/bin/refit" --help >/dev/null
test -f "$prefix/include/refit/trainer_rank.h" || { echo "install_test: include/refit/trainer_rank.h missing" >&2; exit 1; }
if compgen -G "$prefix/include/refit/*" >/dev/null && grep -l '#include "\(cuda\|net\|control\|runtime\|transport\|receiver\|aligner\|batch\|model\)/' "$prefix"/include/refit/*.h; then
  echo "install_test: public headers above include private ones" >&2
  exit 1
fi

# find_package(refit)
cmake -S "$source/tests/consumer" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cmake-build" >/dev/null
out=$("$work/cmake-build/consumer")
echo "find_package: $out"
[[ $out == "consumer ok"* ]]

# pkg-config
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# shellcheck disable=SC2046
g++ -o "$work/consumer-pc" "$source/tests/consumer/consumer.cc" $(pkg-config --cflags --libs refit)
out=$("$work/consumer-pc")
echo "pkg-config: $out"
[[ $out == "consumer ok"* ]]
