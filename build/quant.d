build/quant.o: src/quant.c src/quant.h
src/quant.h:
