/* cmds.h: the dflash CLI's subcommands, one file each (tools/cmd_*.c). Each returns the process
 * exit status: 0 ok, 1 runtime failure (bad file, ...), 2 usage error. */
#ifndef DFL_TOOLS_CMDS_H
#define DFL_TOOLS_CMDS_H

int cmd_gguf(int argc, char **argv);
int cmd_make_test_model(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
