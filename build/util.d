build/util.o: src/util.c src/util.h src/df_error.h
src/util.h:
src/df_error.h:
