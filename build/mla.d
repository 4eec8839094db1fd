build/mla.o: src/mla.c src/model.h src/backend_cpu.h src/kernels.h \
 src/df_error.h src/threadpool.h src/engine.h src/expert_cache.h \
 src/expert_store.h src/mathfn.h src/quant.h src/util.h
src/model.h:
src/backend_cpu.h:
src/kernels.h:
src/df_error.h:
src/threadpool.h:
src/engine.h:
src/expert_cache.h:
src/expert_store.h:
src/mathfn.h:
src/quant.h:
src/util.h:
