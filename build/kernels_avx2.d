build/kernels_avx2.o: src/kernels_avx2.c src/kernels.h src/df_error.h \
 src/quant.h
src/kernels.h:
src/df_error.h:
src/quant.h:
