/* test_ref_selftest.c: runs the numpy reference's own self-test (tests/ref/test_ref.py, Debian's
 * /usr/bin/python3 with python3-numpy) so that the reference every forward test trusts is itself
 * checked by `make test`. Skips (listed as skipped, never passed) where numpy is missing. */
#include "test.h"
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

TEST(ref_numpy_selftest) {
    if (!tu_have_numpy(t)) return;
    static char out[65536];
    char cmd[1024];
    /* the self-test also runs `dflash make-test-model` (the CLI under test) when it is given */
    snprintf(cmd, sizeof(cmd), "DFLASH_CLI='%s' /usr/bin/python3 tests/ref/test_ref.py", test_cli_path());
    const int rc = test_run(cmd, out, sizeof(out));
    CHECK_MSG(rc == 0, "tests/ref/test_ref.py failed (exit %d):\n%s", rc, out);
    /* unittest ends with "OK" (or "OK (skipped=N)") when every test passed */
    CHECK_MSG(strstr(out, "\nOK") != NULL, "tests/ref/test_ref.py did not report OK:\n%s", out);
}
