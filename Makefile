# Kapitsa build. `make help` lists the targets.
CC      ?= cc
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -pthread -MMD -MP
LDLIBS  := -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lcurl -lcrypto -ledit -lm -lpthread
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
TSAN    := -fsanitize=thread -fno-omit-frame-pointer

# The cuda backend: built when nvcc is found (CUDA=0 turns it off, CUDA=1 insists).
# cudart is linked statically, cuBLAS from the toolkit's lib64 (rpath), so the
# binary runs on machines without a GPU, on the cpu backend.
NVCC    ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA    ?= $(if $(NVCC),1,0)
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found; put it on the PATH or set NVCC)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CU_SRC    := $(wildcard src/backend/cuda/*.cu)
CU_OBJ    := $(CU_SRC:%.cu=build/%.o)
CUDA_DEF  := -DKAPITSA_CUDA
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart_static -ldl -lrt -lstdc++
NVFLAGS   ?= -O3 -g -lineinfo
NVFLAGS   += -std=c++17 -Xcompiler -Wall,-Wextra -MMD -MP
NVARCH    := -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# wgmma is sm_90a's alone: flash_sm90.cu and moe_gemm.cu are built for it, plus PTX without it for newer GPUs
build/src/backend/cuda/flash_sm90.o build/src/backend/cuda/moe_gemm.o: NVARCH := -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
endif

# kapitsa --version: VERSION's number and the commit built (git describe; "unknown" outside a
# git checkout). The stamp changes only with them, so version.o is rebuilt only then.
VERSION_NUM   := $(shell cat VERSION)
COMMIT        := $(or $(if $(wildcard .git),$(shell git describe --always --dirty 2>/dev/null)),unknown)
VERSION_STAMP := $(shell mkdir -p build && (echo '$(VERSION_NUM) $(COMMIT)' | cmp -s - build/version.stamp || \
                   echo '$(VERSION_NUM) $(COMMIT)' >build/version.stamp) && echo build/version.stamp)
build/src/cli/version.o build/asan/src/cli/version.o build/tsan/src/cli/version.o: $(VERSION_STAMP)
build/src/cli/version.o build/asan/src/cli/version.o build/tsan/src/cli/version.o: \
    CFLAGS += -DKAPITSA_VERSION='"$(VERSION_NUM)"' -DKAPITSA_COMMIT='"$(COMMIT)"'

SRC     := $(wildcard src/base/*.c src/quant/*.c src/model/*.c src/backend/*.c src/backend/cpu/*.c src/backend/cuda/*.c src/grammar/*.c src/engine/*.c src/tokenizer/*.c src/chat/*.c src/server/*.c src/hub/*.c src/runtime/*.c)
CLI     := $(wildcard src/cli/*.c)
TESTS   := $(wildcard tests/unit/*.c)

# SIMD kernels get their ISA's flags only; kern_best() picks one at run time.
ISA_avx2   := -mavx2 -mfma -mf16c
ISA_avx512 := -mavx512f -mavx512bw -mfma -mf16c
ISA_vnni   := $(ISA_avx512) -mavx512vnni
ISA_bf16   := $(ISA_avx512) -mavx512vl -mavx512bf16
isa = $(if $(findstring kern_avx512,$1),-O3 $(ISA_avx512),$(if $(findstring kern_avx2,$1),-O3 $(ISA_avx2),$(if $(findstring kern_vnni,$1),-O3 $(ISA_vnni),$(if $(findstring kern_bf16,$1),-O3 $(ISA_bf16)))))

# the fuzzers' seed inputs, kept as one archive (1,600 small files would cost
# the repository more than their bytes); unpacked to build/fuzz/seed/TARGET
FUZZ_SEED := build/fuzz/seed/.unpacked
FUZZERS  := build/fuzz/fuzz_tokenizer build/fuzz/fuzz_jinja build/fuzz/fuzz_parser build/fuzz/fuzz_json_guard build/fuzz/fuzz_tool_grammar build/fuzz/fuzz_json_schema build/fuzz/fuzz_request \
            build/fuzz/fuzz_checkpoint build/fuzz/fuzz_tokenizer_load build/fuzz/fuzz_gguf
OBJ      := $(SRC:%.c=build/%.o)
CLI_OBJ  := $(CLI:%.c=build/%.o)
TEST_OBJ := $(TESTS:%.c=build/%.o)
SOBJ      := $(SRC:%.c=build/asan/%.o)
STEST_OBJ := $(TESTS:%.c=build/asan/%.o)
SCLI_OBJ  := $(CLI:%.c=build/asan/%.o)
TOBJ      := $(SRC:%.c=build/tsan/%.o)
TTEST_OBJ := $(TESTS:%.c=build/tsan/%.o)
TCLI_OBJ  := $(CLI:%.c=build/tsan/%.o)
FUZZ_OBJ := $(patsubst %.c,build/fuzz/obj/%.o,$(wildcard src/base/*.c src/quant/*.c src/model/*.c src/backend/*.c \
            src/backend/cpu/*.c src/grammar/*.c src/engine/*.c src/tokenizer/*.c src/chat/*.c))

.PHONY: all test unit debug help clean fuzz fuzz-run serve test-agents install uninstall
all: build/kapitsa

# tools/deps.sh installs the Debian packages this machine lacks (apt-get as root, else sudo,
# else it prints the command to run), once before anything compiles: the build's for every
# object, the tests' too for make test, the unit tests' data and the fuzzers. The test stamp
# waits for the build's, so that two apt-get never run at once.
build/deps-build.stamp: tools/deps.sh
	@mkdir -p build
	@bash tools/deps.sh build
	@touch $@
build/deps-test.stamp: tools/deps.sh build/deps-build.stamp
	@bash tools/deps.sh test
	@touch $@

build/%.o: %.c | build/deps-build.stamp
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CUDA_DEF) $(call isa,$<) -c $< -o $@

build/%.o: %.cu | build/deps-build.stamp
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(NVARCH) -c $< -o $@

build/asan/%.o: %.c | build/deps-build.stamp
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O1 $(SAN) $(call isa,$<) -c $< -o $@

build/tsan/%.o: %.c | build/deps-build.stamp
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O1 $(TSAN) $(call isa,$<) -c $< -o $@

build/kapitsa: $(OBJ) $(CU_OBJ) $(CLI_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) $(CUDA_LIBS)

# the GGUF test files are kept xz-compressed (the repository stays small enough
# to travel to a GPU machine); the unit tests read them unpacked from build/testdata
TESTDATA := $(patsubst tests/data/%.xz,build/testdata/%,$(wildcard tests/data/*/*.xz tests/data/*/*/*.xz))
build/testdata/%: tests/data/%.xz | build/deps-test.stamp
	@mkdir -p $(dir $@)
	xz -dc $< >$@.tmp && mv $@.tmp $@

build/test_unit: $(OBJ) $(CU_OBJ) $(TEST_OBJ) | $(TESTDATA)
	$(CC) $(CFLAGS) $(filter-out $(TESTDATA),$^) -o $@ $(LDLIBS) $(CUDA_LIBS)

# tools/bench_gemv.c: the decode products alone on the cuda backend (a CUDA build)
build/bench_gemv: tools/bench_gemv.c $(OBJ) $(CU_OBJ)
	$(if $(CU_OBJ),,$(error bench_gemv needs the cuda backend: build with CUDA=1))
	$(CC) $(CFLAGS) $(CUDA_DEF) $^ -o $@ $(LDLIBS) $(CUDA_LIBS)

build/asan/kapitsa: $(SOBJ) $(SCLI_OBJ)
	$(CC) $(CFLAGS) $(SAN) $^ -o $@ $(LDLIBS)

build/asan/test_unit: $(SOBJ) $(STEST_OBJ) | $(TESTDATA)
	$(CC) $(CFLAGS) $(SAN) $^ -o $@ $(LDLIBS)

build/tsan/test_unit: $(TOBJ) $(TTEST_OBJ) | $(TESTDATA)
	$(CC) $(CFLAGS) $(TSAN) $^ -o $@ $(LDLIBS)

build/tsan/kapitsa: $(TOBJ) $(TCLI_OBJ)
	$(CC) $(CFLAGS) $(TSAN) $^ -o $@ $(LDLIBS)

## test: build, then run every test, also under ASan+UBSan, and the unit tests and the server under TSan; ends with "N passed, N failed, N skipped"
test: build/deps-test.stamp build/kapitsa build/test_unit build/asan/kapitsa build/asan/test_unit build/tsan/kapitsa build/tsan/test_unit \
      $(FUZZERS) $(FUZZ_SEED)
	@bash tests/run.sh

## unit: build and run the unit tests alone, release build (T=test_tokenizer: one suite); the quick edit-test loop
unit: build/test_unit
	@d=$$(mktemp -d); TMPDIR=$$d build/test_unit $(T); rc=$$?; rm -rf "$$d"; exit $$rc

## serve: build, then serve the embedded default model (kapitsa-tiny) on http://127.0.0.1:11435/v1
serve: build/kapitsa
	build/kapitsa serve

## install: build/kapitsa and its data (catalog, embedded models, tokenizer, serve's web page) under PREFIX (/usr/local), a systemd user unit for serve
# the data goes to $(PREFIX)/share/kapitsa/models and the page to $(PREFIX)/share/kapitsa/web, where
# the binary looks (src/base/path.h); the unit to $(PREFIX)/lib/systemd/user. INSTALL_BIN installs
# another build (tests/cli.sh: the one it tests).
PREFIX      ?= /usr/local
INSTALL_BIN ?= build/kapitsa
DATA        := models/catalog.json models/kapitsa-tiny models/kapitsa-tiny-draft models/qwen3-tokenizer
WEB         := web/index.html web/app.js web/style.css web/favicon.svg
install: $(INSTALL_BIN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/kapitsa/models $(DESTDIR)$(PREFIX)/share/kapitsa/web \
	  $(DESTDIR)$(PREFIX)/lib/systemd/user
	install -m 755 $(INSTALL_BIN) $(DESTDIR)$(PREFIX)/bin/kapitsa
	rm -rf $(addprefix $(DESTDIR)$(PREFIX)/share/kapitsa/,$(DATA))
	cp -R $(DATA) $(DESTDIR)$(PREFIX)/share/kapitsa/models/
	install -m 644 $(WEB) $(DESTDIR)$(PREFIX)/share/kapitsa/web/
	sed 's|@PREFIX@|$(PREFIX)|' contrib/kapitsa.service >$(DESTDIR)$(PREFIX)/lib/systemd/user/kapitsa.service

## uninstall: remove what make install put in $(PREFIX)
uninstall:
	rm -rf $(DESTDIR)$(PREFIX)/bin/kapitsa $(DESTDIR)$(PREFIX)/share/kapitsa $(DESTDIR)$(PREFIX)/lib/systemd/user/kapitsa.service

## test-agents: Claude Code, Codex, opencode, pi and Qwen Code (from npm) through kapitsa launch on the default model (slow: minutes)
test-agents: build/deps-test.stamp build/kapitsa
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

-include $(FUZZ_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(SOBJ:.o=.d) $(STEST_OBJ:.o=.d) $(SCLI_OBJ:.o=.d) \
         $(TOBJ:.o=.d) $(TTEST_OBJ:.o=.d) $(TCLI_OBJ:.o=.d)

# libFuzzer targets (clang): build/fuzz/fuzz_{tokenizer,jinja,parser,json_guard,tool_grammar,json_schema,request,checkpoint,tokenizer_load,gguf}
FUZZ_SAN := -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1
FUZZ_DEPS := $(wildcard src/base/*.c src/tokenizer/*.c src/chat/*.c) src/grammar/grammar.c src/grammar/json_guard.c \
             src/engine/sampler.c
build/fuzz/fuzz_json_guard: tests/fuzz/fuzz_json_guard.c src/grammar/json_guard.c src/base/err.c | build/deps-test.stamp
	@mkdir -p build/fuzz
	clang -std=c11 -Wall -Wextra $(FUZZ_SAN) $^ -o $@ $(LDLIBS)
build/fuzz/fuzz_gguf: tests/fuzz/fuzz_gguf.c src/model/gguf.c src/base/err.c src/base/dtype.c | build/deps-test.stamp
	@mkdir -p build/fuzz
	clang -std=c11 -Wall -Wextra $(FUZZ_SAN) $^ -o $@ $(LDLIBS)
build/fuzz/fuzz_request: tests/fuzz/fuzz_request.c src/server/convert.c $(FUZZ_DEPS) | build/deps-test.stamp
	@mkdir -p build/fuzz
	clang -std=c11 -Wall -Wextra $(FUZZ_SAN) $^ -o $@ $(LDLIBS)
# fuzz_checkpoint loads and runs models: the model, cpu backend and engine
# objects (FUZZ_OBJ), each with its own ISA flags, instrumented for the fuzzer.
build/fuzz/obj/%.o: %.c | build/deps-test.stamp
	@mkdir -p $(dir $@)
	clang -std=c11 -Wall -Wextra -pthread -MMD -MP -fsanitize=fuzzer-no-link,address,undefined \
	  -fno-sanitize-recover=all -g -O1 $(call isa,$<) -c $< -o $@
build/fuzz/fuzz_checkpoint: tests/fuzz/fuzz_checkpoint.c $(FUZZ_OBJ)
	clang -std=c11 -Wall -Wextra -pthread $(FUZZ_SAN) $^ -o $@ $(LDLIBS)
build/fuzz/%: tests/fuzz/%.c tests/fuzz/guard_check.h $(FUZZ_DEPS) | build/deps-test.stamp
	@mkdir -p build/fuzz
	clang -std=c11 -Wall -Wextra $(FUZZ_SAN) $< $(FUZZ_DEPS) -o $@ $(LDLIBS)

$(FUZZ_SEED): tests/fuzz/corpus.tar.xz
	@rm -rf build/fuzz/seed && mkdir -p build/fuzz/seed
	tar xJf $< -C build/fuzz/seed --strip-components=1 && touch $@

## fuzz: build the libFuzzer targets and unpack their seeds; FUZZ_TIME=600 make fuzz-run runs each that many seconds
fuzz: $(FUZZERS) $(FUZZ_SEED)
fuzz-run: $(FUZZERS) $(FUZZ_SEED)
	@for f in tokenizer jinja parser json_guard tool_grammar json_schema request checkpoint tokenizer_load gguf; do mkdir -p build/fuzz/corpus-$$f; \
	  build/fuzz/fuzz_$$f $$([ -f tests/fuzz/$$f.dict ] && echo -dict=tests/fuzz/$$f.dict) \
	    -max_total_time=$${FUZZ_TIME:-10} -timeout=10 -rss_limit_mb=2048 \
	    build/fuzz/corpus-$$f build/fuzz/seed/$$f || exit 1; done
