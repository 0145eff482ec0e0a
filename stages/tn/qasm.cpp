// OpenQASM 2.0 (with qelib1.inc) into a Circuit: registers are laid out one after another in
// declaration order; gate calls on whole registers broadcast; user `gate` definitions expand
// inline. Errors name the line.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <memory>

#include "core/error.hpp"
#include "stages/tn/circuit.hpp"

namespace qstage::tn {

namespace {

struct Token {
  enum Kind { id, number, string, symbol, end } kind = end;
  std::string text;
  int line = 0;
};

std::vector<Token> tokenize(std::string_view s, const std::string& source) {
  std::vector<Token> out;
  int line = 1;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '/' && i + 1 < s.size() && s[i + 1] == '/') {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::id, std::string(s.substr(i, j - i)), line});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])))) {
      size_t j = i;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.')) ++j;
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        ++j;
        if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      out.push_back({Token::number, std::string(s.substr(i, j - i)), line});
      i = j;
    } else if (c == '"') {
      size_t j = s.find('"', i + 1);
      if (j == std::string_view::npos) throw InputError(fmt::format("{}:{}: unterminated string", source, line));
      out.push_back({Token::string, std::string(s.substr(i + 1, j - i - 1)), line});
      i = j + 1;
    } else if (c == '-' && i + 1 < s.size() && s[i + 1] == '>') {
      out.push_back({Token::symbol, "->", line});
      i += 2;
    } else if (std::string_view("()[]{},;+-*/^").find(c) != std::string_view::npos) {
      out.push_back({Token::symbol, std::string(1, c), line});
      ++i;
    } else {
      throw InputError(fmt::format("{}:{}: unexpected character '{}'", source, line, c));
    }
  }
  out.push_back({Token::end, "", line});
  return out;
}

// An arithmetic expression over gate parameters.
struct Expr {
  enum Kind { number, param, unary, binary, call } kind = number;
  double value = 0;
  std::string name;  // param or function
  char op = 0;
  std::vector<Expr> args;

  double eval(const std::map<std::string, double>& env, const std::string& where) const {
    switch (kind) {
      case number: return value;
      case param: {
        auto it = env.find(name);
        if (it == env.end()) throw InputError(fmt::format("{}: unknown parameter '{}'", where, name));
        return it->second;
      }
      case unary: return -args[0].eval(env, where);
      case binary: {
        const double a = args[0].eval(env, where), b = args[1].eval(env, where);
        switch (op) {
          case '+': return a + b;
          case '-': return a - b;
          case '*': return a * b;
          case '/': return a / b;
          default: return std::pow(a, b);
        }
      }
      case call: {
        static const std::map<std::string, double (*)(double)> f = {
            {"sin", std::sin}, {"cos", std::cos}, {"tan", std::tan}, {"exp", std::exp}, {"ln", std::log}, {"sqrt", std::sqrt}};
        return f.at(name)(args[0].eval(env, where));
      }
    }
    return 0;
  }
};

// A gate parameter as written: its expression and its text (for messages).
struct Angle {
  Expr expr;
  std::string text;

  // Its value; an angle such as 0/0 or 1/0 (NaN or inf) would make every amplitude NaN.
  double eval(const std::map<std::string, double>& env, const std::string& where) const {
    const double value = expr.eval(env, where);
    if (!std::isfinite(value))
      throw InputError(fmt::format("{}: angle '{}' evaluates to {}; expected a finite angle", where, text,
                                   std::isnan(value) ? "nan" : fmt::format("{}", value)));  // (0/0 is -nan on x86)
    return value;
  }
};

struct Call {  // a gate application inside a gate definition
  std::string name;
  std::vector<Angle> params;
  std::vector<std::string> args;
  int line = 0;
};

struct Definition {
  std::vector<std::string> params, args;
  std::vector<Call> body;
};

struct Arg {  // q[i] or a whole register q
  std::string reg;
  long index = -1;
};

class Parser {
 public:
  Parser(std::string_view text, std::string source) : tokens_(tokenize(text, source)), source_(std::move(source)) {}

  Circuit parse() {
    circuit_.source = source_;
    if (peek().kind == Token::id && peek().text == "OPENQASM") {
      next();
      const Token v = expect(Token::number, "a version number");
      if (v.text != "2.0" && v.text != "2")
        fail(v, fmt::format("OPENQASM {} is not supported; expected OPENQASM 2.0", v.text));
      expect_symbol(";");
    }
    while (peek().kind != Token::end) statement();
    if (circuit_.qubits == 0) throw InputError(fmt::format("{}: no qreg declared; expected 'qreg q[n];'", source_));
    return std::move(circuit_);
  }

 private:
  const Token& peek() const { return tokens_[pos_]; }
  Token next() { return tokens_[pos_++]; }
  [[noreturn]] void fail(const Token& t, const std::string& what) const {
    throw InputError(fmt::format("{}:{}: {}", source_, t.line, what));
  }
  Token expect(Token::Kind kind, const char* what) {
    if (peek().kind != kind) fail(peek(), fmt::format("expected {}, found '{}'", what, peek().text));
    return next();
  }
  void expect_symbol(const char* s) {
    if (peek().kind != Token::symbol || peek().text != s) fail(peek(), fmt::format("expected '{}', found '{}'", s, peek().text));
    next();
  }
  bool accept_symbol(const char* s) {
    if (peek().kind == Token::symbol && peek().text == s) {
      next();
      return true;
    }
    return false;
  }

  void statement() {
    const Token t = expect(Token::id, "a statement");
    if (t.text == "include") {
      const Token f = expect(Token::string, "a file name");
      if (f.text != "qelib1.inc") fail(f, fmt::format("include \"{}\" is not supported; expected \"qelib1.inc\"", f.text));
      expect_symbol(";");
    } else if (t.text == "qreg" || t.text == "creg") {
      const Token name = expect(Token::id, "a register name");
      expect_symbol("[");
      const Token n = expect(Token::number, "a register size");
      expect_symbol("]");
      expect_symbol(";");
      if (t.text == "qreg") {
        const long size = std::stol(n.text);
        if (size <= 0) fail(n, "a register needs at least one qubit");
        if (qregs_.count(name.text)) fail(name, fmt::format("register '{}' is declared twice", name.text));
        qregs_[name.text] = {circuit_.qubits, size};
        circuit_.qubits += static_cast<int>(size);
      }
    } else if (t.text == "gate") {
      definition();
    } else if (t.text == "opaque") {
      fail(t, "opaque gates are not supported; expected gates with a definition");
    } else if (t.text == "barrier") {
      while (!accept_symbol(";")) next();
    } else if (t.text == "measure") {
      while (!accept_symbol(";")) next();  // amplitudes are computed, not sampled
    } else if (t.text == "reset" || t.text == "if") {
      fail(t, fmt::format("'{}' is not supported in a circuit for amplitudes", t.text));
    } else {
      application(t);
    }
  }

  // expr := term (('+'|'-') term)*; term := power (('*'|'/') power)*; power := unary ('^' power)?
  Expr expression() {
    Expr e = term();
    while (peek().kind == Token::symbol && (peek().text == "+" || peek().text == "-")) {
      const char op = next().text[0];
      e = Expr{Expr::binary, 0, "", op, {e, term()}};
    }
    return e;
  }
  Expr term() {
    Expr e = power();
    while (peek().kind == Token::symbol && (peek().text == "*" || peek().text == "/")) {
      const char op = next().text[0];
      e = Expr{Expr::binary, 0, "", op, {e, power()}};
    }
    return e;
  }
  Expr power() {
    Expr e = unary();
    if (accept_symbol("^")) e = Expr{Expr::binary, 0, "", '^', {e, power()}};
    return e;
  }
  Expr unary() {
    if (accept_symbol("-")) return Expr{Expr::unary, 0, "", '-', {unary()}};
    if (accept_symbol("+")) return unary();
    if (accept_symbol("(")) {
      Expr e = expression();
      expect_symbol(")");
      return e;
    }
    const Token t = next();
    if (t.kind == Token::number) {
      const double value = std::strtod(t.text.c_str(), nullptr);  // (std::stod throws on 1e999)
      if (!std::isfinite(value)) fail(t, fmt::format("number '{}' is out of range; expected a finite number", t.text));
      return number(value);
    }
    if (t.kind == Token::id) {
      if (t.text == "pi") return number(M_PI);
      static const char* functions[] = {"sin", "cos", "tan", "exp", "ln", "sqrt"};
      for (const char* f : functions)
        if (t.text == f) {
          expect_symbol("(");
          Expr arg = expression();
          expect_symbol(")");
          return Expr{Expr::call, 0, t.text, 0, {arg}};
        }
      return Expr{Expr::param, 0, t.text, 0, {}};
    }
    fail(t, fmt::format("expected a number, 'pi', a parameter or '(', found '{}'", t.text));
  }

  static Expr number(double v) { return Expr{Expr::number, v, "", 0, {}}; }

  std::vector<Angle> parameter_list() {
    std::vector<Angle> ps;
    if (accept_symbol("(")) {
      if (!accept_symbol(")")) {
        do {
          const std::size_t first = pos_;
          Expr e = expression();
          std::string text;
          for (std::size_t k = first; k < pos_; ++k) text += tokens_[k].text;
          ps.push_back({std::move(e), std::move(text)});
        } while (accept_symbol(","));
        expect_symbol(")");
      }
    }
    return ps;
  }

  void definition() {
    const Token name = expect(Token::id, "a gate name");
    Definition d;
    if (accept_symbol("(")) {
      if (!accept_symbol(")")) {
        do d.params.push_back(expect(Token::id, "a parameter name").text);
        while (accept_symbol(","));
        expect_symbol(")");
      }
    }
    do d.args.push_back(expect(Token::id, "a qubit argument").text);
    while (accept_symbol(","));
    expect_symbol("{");
    while (!accept_symbol("}")) {
      const Token t = expect(Token::id, "a gate call");
      if (t.text == "barrier") {
        while (!accept_symbol(";")) next();
        continue;
      }
      Call call{t.text, parameter_list(), {}, t.line};
      do call.args.push_back(expect(Token::id, "a qubit argument").text);
      while (accept_symbol(","));
      expect_symbol(";");
      d.body.push_back(std::move(call));
    }
    definitions_[name.text] = std::move(d);
  }

  Arg argument() {
    const Token r = expect(Token::id, "a register");
    if (!qregs_.count(r.text)) fail(r, fmt::format("unknown register '{}'", r.text));
    Arg a{r.text, -1};
    if (accept_symbol("[")) {
      const Token n = expect(Token::number, "a qubit index");
      expect_symbol("]");
      a.index = std::stol(n.text);
      if (a.index >= qregs_[r.text].second)
        fail(n, fmt::format("qubit {}[{}] is out of range; register '{}' has {} qubits", r.text, a.index, r.text,
                            qregs_[r.text].second));
    }
    return a;
  }

  void application(const Token& name) {
    const auto angles = parameter_list();
    std::vector<double> params;
    for (const auto& a : angles) params.push_back(a.eval({}, fmt::format("{}:{}", source_, name.line)));
    std::vector<Arg> args;
    do args.push_back(argument());
    while (accept_symbol(","));
    expect_symbol(";");
    // Broadcast over whole registers of equal size.
    long width = 1;
    for (const auto& a : args)
      if (a.index < 0) {
        const long size = qregs_[a.reg].second;
        if (width != 1 && size != width) fail(name, "registers of different sizes in one gate call");
        width = size;
      }
    for (long i = 0; i < width; ++i) {
      std::vector<int> qubits;
      for (const auto& a : args) qubits.push_back(qregs_[a.reg].first + static_cast<int>(a.index < 0 ? i : a.index));
      apply(name.text, params, qubits, name.line, 0);
    }
  }

  void apply(const std::string& name, const std::vector<double>& params, const std::vector<int>& qubits, int line, int depth) {
    const std::string where = fmt::format("{}:{}", source_, line);
    if (depth > 64) throw InputError(fmt::format("{}: gate definitions nest too deep (recursive '{}'?)", where, name));
    for (size_t i = 0; i < qubits.size(); ++i)
      for (size_t j = i + 1; j < qubits.size(); ++j)
        if (qubits[i] == qubits[j]) throw InputError(fmt::format("{}: gate '{}' names the same qubit twice", where, name));
    auto def = definitions_.find(name);
    if (def != definitions_.end()) {
      const Definition& d = def->second;
      if (d.params.size() != params.size() || d.args.size() != qubits.size())
        throw InputError(fmt::format("{}: gate '{}' takes {} parameter(s) and {} qubit(s); got {} and {}", where, name,
                                     d.params.size(), d.args.size(), params.size(), qubits.size()));
      std::map<std::string, double> env;
      for (size_t i = 0; i < params.size(); ++i) env[d.params[i]] = params[i];
      std::map<std::string, int> bind;
      for (size_t i = 0; i < qubits.size(); ++i) bind[d.args[i]] = qubits[i];
      for (const auto& call : d.body) {
        std::vector<double> ps;
        for (const auto& a : call.params) ps.push_back(a.eval(env, fmt::format("{}:{}", source_, call.line)));
        std::vector<int> qs;
        for (const auto& a : call.args) {
          auto it = bind.find(a);
          if (it == bind.end())
            throw InputError(fmt::format("{}:{}: unknown qubit argument '{}' in gate '{}'", source_, call.line, a, name));
          qs.push_back(it->second);
        }
        apply(call.name, ps, qs, call.line, depth + 1);
      }
      return;
    }
    std::string builtin = name == "cp" ? "cu1" : name == "u0" ? "id" : name;  // qelib1 semantics
    const int arity = gate_arity(builtin);
    if (arity == 0) throw InputError(fmt::format("{}: unknown gate '{}'; expected a qelib1.inc gate or a defined one", where, name));
    if (arity != static_cast<int>(qubits.size()))
      throw InputError(fmt::format("{}: gate '{}' acts on {} qubit(s); got {}", where, name, arity, qubits.size()));
    std::vector<double> ps = params;
    if (name == "u0") ps.clear();
    Gate g{builtin, qubits, ps, gate_matrix(builtin, ps, where), static_cast<int>(circuit_.gates.size()), line};
    circuit_.gates.push_back(std::move(g));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::string source_;
  Circuit circuit_;
  std::map<std::string, std::pair<int, long>> qregs_;  // name -> (first qubit, size)
  std::map<std::string, Definition> definitions_;
};

}  // namespace

Circuit parse_qasm(std::string_view text, std::string source) { return Parser(text, std::move(source)).parse(); }

}  // namespace qstage::tn
