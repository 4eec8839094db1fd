build/backend_cpu.o: src/backend_cpu.c src/backend_cpu.h src/kernels.h \
 src/df_error.h src/threadpool.h src/util.h
src/backend_cpu.h:
src/kernels.h:
src/df_error.h:
src/threadpool.h:
src/util.h:
