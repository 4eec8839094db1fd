build/cli.o: src/cli.c src/engine.h src/df_error.h
src/engine.h:
src/df_error.h:
