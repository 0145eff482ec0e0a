#include "cli/cli.hpp"

int main(int argc, char** argv) { return qstage::cli::main(argc, argv); }
