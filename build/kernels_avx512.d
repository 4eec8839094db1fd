build/kernels_avx512.o: src/kernels_avx512.c src/kernels.h src/df_error.h \
 src/quant.h
src/kernels.h:
src/df_error.h:
src/quant.h:
