build/kernels_ref.o: src/kernels_ref.c src/kernels.h src/df_error.h \
 src/quant.h src/util.h
src/kernels.h:
src/df_error.h:
src/quant.h:
src/util.h:
