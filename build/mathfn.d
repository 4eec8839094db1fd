build/mathfn.o: src/mathfn.c src/mathfn.h
src/mathfn.h:
