build/threadpool.o: src/threadpool.c src/threadpool.h src/util.h \
 src/df_error.h
src/threadpool.h:
src/util.h:
src/df_error.h:
