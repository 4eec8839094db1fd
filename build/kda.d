build/kda.o: src/kda.c src/model.h src/backend_cpu.h src/kernels.h \
 src/df_error.h src/threadpool.h src/engine.h src/expert_cache.h \
 src/expert_store.h src/mathfn.h
src/model.h:
src/backend_cpu.h:
src/kernels.h:
src/df_error.h:
src/threadpool.h:
src/engine.h:
src/expert_cache.h:
src/expert_store.h:
src/mathfn.h:
