/* zz_tmp_cmds.c: TEMPORARY (branch gguf only): lets build/dflash link until cmd_tokenize lands. */
#include "cmds.h"
#include <stdio.h>
int cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "not yet\n"); return 1; }
