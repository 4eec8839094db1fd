build/expert_store.o: src/expert_store.c src/expert_store.h \
 src/df_error.h src/util.h
src/expert_store.h:
src/df_error.h:
src/util.h:
