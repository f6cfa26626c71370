/* zz_tmp_cmds.c: TEMPORARY stub so the vocab branch links before make-test-model lands; removed
 * after merging main once it exists. */
#include "cmds.h"

#include <stdio.h>

int cmd_make_test_model(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "not yet\n");
    return 1;
}
