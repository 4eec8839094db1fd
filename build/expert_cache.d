build/expert_cache.o: src/expert_cache.c src/expert_cache.h src/util.h \
 src/df_error.h
src/expert_cache.h:
src/util.h:
src/df_error.h:
