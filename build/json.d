build/json.o: src/json.c src/json.h src/df_error.h src/util.h
src/json.h:
src/df_error.h:
src/util.h:
