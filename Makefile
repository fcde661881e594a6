# Thin wrapper over CMake: `make`, `make test`, `make asan`, `make fuzz`, `make run`.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# Developers and CI build with warnings as errors; a plain `cmake` build (users, packagers) does not.
WERROR ?= ON

.PHONY: all test asan fuzz release run clean deps

all: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DEMBER_WERROR=$(WERROR) $(CMAKE_FLAGS)

test: all
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DEMBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"

# The build types packagers use, with both compilers, warnings as errors (CI runs this).
release:
	$(MAKE) all BUILD=build-release CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release"
	CC=clang $(MAKE) all BUILD=build-release-clang CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang"

# Each fuzz target for FUZZ_SECONDS (default 60) on its seed corpus.
FUZZ_SECONDS ?= 60
fuzz:
	CC=clang $(MAKE) all BUILD=build-fuzz CMAKE_FLAGS="-DEMBER_FUZZ=ON -DCMAKE_C_COMPILER=clang"
	bash scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

# The main job: builds `ember` and runs the default model pair (models/: a small trained
# Kimi-Linear target and its DSpark drafter) on a chat prompt with speculative decoding; the
# generated text, then one summary line from ember's stderr (full log in $(BUILD)/run.log).
RUN_PROMPT ?= Write a Python function `quote`: Quote a string for use in a URL.
RUN_FLAGS ?= -n 128 --temp 0
run: $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) --target ember -j $(JOBS) >/dev/null
	@$(BUILD)/ember run --chat -p '$(RUN_PROMPT)' $(RUN_FLAGS) 2>$(BUILD)/run.log || { cat $(BUILD)/run.log >&2; exit 1; }
	@gen=$$(sed -nE 's/.*generated ([0-9]+) tokens \(([0-9.]+) tok\/s\).*/\1 tokens, \2 tok\/s/p' $(BUILD)/run.log); \
	 spec=$$(sed -nE 's/.*speculative: [0-9]+ passes, ([0-9]+) of ([0-9]+) drafts accepted, ([0-9.]+) tokens per pass.*/tau \3 tokens per target pass, \1\/\2 drafts accepted/p' $(BUILD)/run.log); \
	 if [ -n "$$gen" ]; then echo "== $$gen, $${spec:-plain decoding (no drafter)}"; else cat $(BUILD)/run.log; fi

deps:
	bash scripts/deps.sh

clean:
	rm -rf build build-asan build-fuzz build-release build-release-clang
