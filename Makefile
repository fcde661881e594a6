# Thin wrapper over CMake: `make`, `make test`, `make asan`, `make fuzz`, `make run`.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all test asan fuzz run clean deps

all: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

test: all
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DEMBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"

# Each fuzz target for FUZZ_SECONDS (default 60) on its seed corpus.
FUZZ_SECONDS ?= 60
fuzz:
	CC=clang $(MAKE) all BUILD=build-fuzz CMAKE_FLAGS="-DEMBER_FUZZ=ON -DCMAKE_C_COMPILER=clang"
	bash scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

# Until the trained default model exists (issue 7), `make run` runs the tiny test model.
run: all
	@echo "make run: NOTE: there is no trained default model yet (issue 7). This runs tests/fixtures/kimi_a, a tiny RANDOM-WEIGHT test model, so the text it prints is gibberish."
	@test -f $(BUILD)/kimi_a-q8_0.gguf || $(BUILD)/ember convert tests/fixtures/kimi_a -o $(BUILD)/kimi_a-q8_0.gguf --type q8_0 >/dev/null
	$(BUILD)/ember run -m $(BUILD)/kimi_a-q8_0.gguf --chat -p "Tell me a short story." -n 48

deps:
	bash scripts/deps.sh

clean:
	rm -rf build build-asan build-fuzz
