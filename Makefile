# Kapitsa build. `make help` lists the targets.
CC      ?= cc
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -pthread -MMD -MP
LDLIBS  := -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -lpthread
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all

SRC     := $(wildcard src/base/*.c src/model/*.c src/backend/*.c src/backend/cpu/*.c src/engine/*.c src/tokenizer/*.c src/chat/*.c src/server/*.c)
CLI     := $(wildcard src/cli/*.c)
TESTS   := $(wildcard tests/unit/*.c)

# SIMD kernels get their ISA's flags only; kern_best() picks one at run time.
ISA_avx2   := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mfma -mf16c
isa = $(if $(findstring kern_avx512,$1),-O3 $(ISA_avx512),$(if $(findstring kern_avx2,$1),-O3 $(ISA_avx2)))

FUZZERS  := build/fuzz/fuzz_tokenizer build/fuzz/fuzz_jinja build/fuzz/fuzz_parser
OBJ      := $(SRC:%.c=build/%.o)
CLI_OBJ  := $(CLI:%.c=build/%.o)
TEST_OBJ := $(TESTS:%.c=build/%.o)
SOBJ      := $(SRC:%.c=build/asan/%.o)
STEST_OBJ := $(TESTS:%.c=build/asan/%.o)
SCLI_OBJ  := $(CLI:%.c=build/asan/%.o)

.PHONY: all test debug help clean fuzz fuzz-run serve test-agents
all: build/kapitsa

build/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(call isa,$<) -c $< -o $@

build/asan/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O1 $(SAN) $(call isa,$<) -c $< -o $@

build/kapitsa: $(OBJ) $(CLI_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

build/test_unit: $(OBJ) $(TEST_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

build/asan/kapitsa: $(SOBJ) $(SCLI_OBJ)
	$(CC) $(CFLAGS) $(SAN) $^ -o $@ $(LDLIBS)

build/asan/test_unit: $(SOBJ) $(STEST_OBJ)
	$(CC) $(CFLAGS) $(SAN) $^ -o $@ $(LDLIBS)

## test: build, then run every test, also under ASan+UBSan; ends with "N passed, N failed"
test: build/kapitsa build/test_unit build/asan/kapitsa build/asan/test_unit $(FUZZERS)
	@bash tests/run.sh

## serve: build, then serve the embedded default model (kapitsa-tiny) on http://127.0.0.1:11435/v1
serve: build/kapitsa
	build/kapitsa serve

## test-agents: Claude Code (from npm) through kapitsa launch on the default model (slow: minutes)
test-agents: build/kapitsa
	@bash tests/agents.sh

## debug: the CLI and tests with ASan+UBSan in build/asan/
debug: build/asan/kapitsa build/asan/test_unit

## help: this list
help:
	@echo "make            build build/kapitsa"
	@grep -h '^## ' $(MAKEFILE_LIST) | sed 's/^## /make /'

## clean: remove build/
clean:
	rm -rf build

-include $(OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(SOBJ:.o=.d) $(STEST_OBJ:.o=.d) $(SCLI_OBJ:.o=.d)

# libFuzzer targets (clang): build/fuzz/fuzz_{tokenizer,jinja,parser}
FUZZ_SAN := -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1
FUZZ_DEPS := $(wildcard src/base/*.c src/tokenizer/*.c src/chat/*.c)
build/fuzz/%: tests/fuzz/%.c $(FUZZ_DEPS)
	@mkdir -p build/fuzz
	clang -std=c11 -Wall -Wextra $(FUZZ_SAN) $< $(FUZZ_DEPS) -o $@ $(LDLIBS)

## fuzz: build the libFuzzer targets; FUZZ_TIME=600 make fuzz-run runs each that many seconds
fuzz: $(FUZZERS)
fuzz-run: $(FUZZERS)
	@for f in tokenizer jinja parser; do mkdir -p build/fuzz/corpus-$$f; \
	  build/fuzz/fuzz_$$f -max_total_time=$${FUZZ_TIME:-10} -timeout=10 -rss_limit_mb=2048 \
	    build/fuzz/corpus-$$f tests/fuzz/corpus/$$f || exit 1; done
