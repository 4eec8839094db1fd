build/safetensors.o: src/safetensors.c src/safetensors.h src/df_error.h \
 src/json.h src/util.h
src/safetensors.h:
src/df_error.h:
src/json.h:
src/util.h:
