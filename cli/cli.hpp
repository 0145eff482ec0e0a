#pragma once
// The `qstage` command line: one function per command, each returning an exit code.
#include <string>
#include <vector>

namespace qstage::cli {

using Args = std::vector<std::string>;  // the arguments after the command name

int main(int argc, char** argv);

int run(const Args& args, int* argc, char*** argv);
int resume(const Args& args, int* argc, char*** argv);
int status(const Args& args);
int inspect(const Args& args);
int validate(const Args& args);
int stages(const Args& args);

// Shared by the commands.
std::string version_text();

}  // namespace qstage::cli
