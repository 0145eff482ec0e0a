#include "stages/sci/fcidump.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.hpp"
#include "core/fsutil.hpp"

namespace qstage::sci {

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Where a piece of text starts in the file, for messages.
struct Cursor {
  const std::string& name;
  std::size_t line = 1;
  [[noreturn]] void fail(const std::string& what) const { throw InputError(fmt::format("{}:{}: {}", name, line, what)); }
};

// Fortran reals: `D` exponents; anything strtod does not take whole, or a non-finite value, is
// refused.
double parse_real(std::string token, const Cursor& at) {
  std::replace(token.begin(), token.end(), 'D', 'E');
  std::replace(token.begin(), token.end(), 'd', 'e');
  char* end = nullptr;
  const double v = std::strtod(token.c_str(), &end);
  if (token.empty() || end != token.c_str() + token.size())
    at.fail(fmt::format("'{}' is not a number; expected an integral value such as 0.5 or -1.2D-03", token));
  if (!std::isfinite(v)) at.fail(fmt::format("the value '{}' is not finite; expected a finite integral", token));
  return v;
}

long parse_int(const std::string& token, const Cursor& at, const std::string& what) {
  char* end = nullptr;
  const long v = std::strtol(token.c_str(), &end, 10);
  if (token.empty() || end != token.c_str() + token.size())
    at.fail(fmt::format("'{}' is not an integer; expected {}", token, what));
  return v;
}

// The namelist's text between `&FCI` and its end (`&END`, `/` or `$END`), and the offset and line
// after it.
struct Header {
  std::map<std::string, std::vector<std::string>> values;  // KEY -> its comma-separated values
  std::size_t end = 0;
  std::size_t end_line = 1;
};

// 1-based line of a byte offset.
std::size_t line_of(const std::string& text, std::size_t offset) {
  return 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(std::min(offset, text.size())), '\n'));
}

Header read_header(const std::string& text, Cursor& at) {
  std::size_t pos = text.find_first_not_of(" \t\r\n");
  at.line = line_of(text, pos == std::string::npos ? text.size() : pos);
  if (pos == std::string::npos || upper(text.substr(pos, 4)) != "&FCI")
    at.fail("the file does not start with a namelist '&FCI ...'; expected an FCIDUMP header such as "
            "'&FCI NORB=4,NELEC=6,MS2=0 &END'");
  const std::size_t start_line = at.line;
  pos += 4;
  // The end: '&END', '$END' or a '/' (outside the values; values hold no slashes).
  std::size_t stop = std::string::npos, after = std::string::npos;
  for (std::size_t i = pos; i < text.size(); ++i) {
    if (text[i] == '/') {
      stop = i;
      after = i + 1;
      break;
    }
    if ((text[i] == '&' || text[i] == '$') && upper(text.substr(i + 1, 3)) == "END") {
      stop = i;
      after = i + 4;
      break;
    }
  }
  if (stop == std::string::npos) {
    at.line = start_line;
    at.fail("the namelist header has no end; expected '&END', '$END' or '/' after its values (a truncated file?)");
  }
  Header h;
  // KEY=v1,v2,... with keys ending at '=' and values running to the next key.
  std::string body = text.substr(pos, stop - pos);
  std::replace(body.begin(), body.end(), '\n', ' ');
  std::replace(body.begin(), body.end(), '\r', ' ');
  std::string key;
  std::size_t i = 0;
  while (i < body.size()) {
    const std::size_t eq = body.find('=', i);
    if (eq == std::string::npos) break;
    // The key is the identifier just before '='.
    std::size_t k = eq;
    while (k > i && std::isspace(static_cast<unsigned char>(body[k - 1]))) --k;
    std::size_t ks = k;
    while (ks > i && (std::isalnum(static_cast<unsigned char>(body[ks - 1])) || body[ks - 1] == '_')) --ks;
    if (!key.empty()) {  // the previous key's values run up to this key
      std::stringstream values(body.substr(i, ks - i));
      std::string v;
      while (std::getline(values, v, ',')) {
        v.erase(std::remove_if(v.begin(), v.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }), v.end());
        if (!v.empty()) h.values[key].push_back(v);
      }
    }
    key = upper(body.substr(ks, k - ks));
    if (key.empty()) {
      at.line = start_line;
      at.fail("a '=' in the namelist header has no name before it; expected KEY=value");
    }
    h.values[key];
    i = eq + 1;
  }
  if (!key.empty()) {
    std::stringstream values(body.substr(i));
    std::string v;
    while (std::getline(values, v, ',')) {
      v.erase(std::remove_if(v.begin(), v.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }), v.end());
      if (!v.empty()) h.values[key].push_back(v);
    }
  }
  h.end = after;
  h.end_line = line_of(text, after);
  at.line = start_line;  // (header errors name the line where it starts)
  return h;
}

int header_int(const Header& h, const std::string& key, Cursor& at, std::size_t line, bool required, int fallback) {
  const auto it = h.values.find(key);
  at.line = line;
  if (it == h.values.end() || it->second.empty()) {
    if (required) at.fail(fmt::format("the header gives no {}; expected {}=<integer> in the namelist", key, key));
    return fallback;
  }
  return static_cast<int>(parse_int(it->second[0], at, fmt::format("an integer for {}", key)));
}

void check_electrons(const Integrals& r, Cursor& at) {
  if (r.norb <= 0) at.fail(fmt::format("NORB={}; expected at least one orbital", r.norb));
  if (r.norb > kMaxOrbitals)
    at.fail(fmt::format("NORB={} is more than {} orbitals per spin; expected at most {} (one 64-bit occupation "
                        "string per spin)", r.norb, kMaxOrbitals, kMaxOrbitals));
  if (r.nelec < 0 || (r.nelec + r.ms2) % 2 != 0 || std::abs(r.ms2) > r.nelec)
    at.fail(fmt::format("NELEC={} and MS2={} do not describe whole alpha and beta electrons; expected NELEC + MS2 "
                        "even and |MS2| <= NELEC", r.nelec, r.ms2));
  if (r.nalpha() > r.norb || r.nbeta() > r.norb)
    at.fail(fmt::format("NELEC={}, MS2={} put {} alpha and {} beta electrons into {} orbitals; expected at most "
                        "NORB of each spin", r.nelec, r.ms2, r.nalpha(), r.nbeta(), r.norb));
}

// Writers may give an integral more than once, in two of its orders (Dice writes (ij|kl) and
// (kl|ij), which differ in the last bits). The first one is kept; a repeat that differs by
// more than rounding is an error naming both lines. Returns whether `v` is the first.
bool keep_first(std::vector<std::size_t>& first_line, std::uint64_t index, double kept, double v, const Cursor& at,
                Integrals& r) {
  if (first_line[index] == 0) {
    first_line[index] = at.line;
    return true;
  }
  ++r.repeated_lines;
  if (std::abs(v - kept) > kRepeatTolerance * std::max(1.0, std::abs(kept)))
    at.fail(fmt::format("{} repeats the integral of line {} with another value ({}); expected the same value "
                        "(within {:g}) for every order of one integral", v, first_line[index], kept, kRepeatTolerance));
  return false;
}

}  // namespace

std::uint64_t packed_eri_size(int norb) {
  const auto pairs = static_cast<std::uint64_t>(norb) * static_cast<std::uint64_t>(norb + 1) / 2;
  return pairs * (pairs + 1) / 2;
}

double Integrals::eri_at(int i, int j, int k, int l) const {
  return eri[pair_index(pair_index(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(j)),
                        pair_index(static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(l)))];
}

Integrals parse_fcidump(const std::string& text, const std::string& name) {
  Cursor at{name};
  const Header h = read_header(text, at);
  const std::size_t header_line = at.line;  // where '&FCI' is
  Integrals r;
  r.norb = header_int(h, "NORB", at, header_line, true, 0);
  r.nelec = header_int(h, "NELEC", at, header_line, true, 0);
  r.ms2 = header_int(h, "MS2", at, header_line, false, 0);
  r.isym = header_int(h, "ISYM", at, header_line, false, 1);
  if (const auto it = h.values.find("UHF"); it != h.values.end() && !it->second.empty()) {
    const std::string v = upper(it->second[0]);
    if (v == ".TRUE." || v == "T" || v == "TRUE" || v == "1")
      at.fail("UHF=.TRUE.: the file holds separate alpha and beta integrals; expected restricted (UHF=.FALSE.) "
              "integrals, one set for both spins");
  }
  check_electrons(r, at);
  r.orbsym.assign(static_cast<std::size_t>(r.norb), 1);
  if (const auto it = h.values.find("ORBSYM"); it != h.values.end() && !it->second.empty()) {
    if (it->second.size() != static_cast<std::size_t>(r.norb))
      at.fail(fmt::format("ORBSYM has {} labels; expected NORB={} (one irrep label per orbital)", it->second.size(), r.norb));
    for (std::size_t o = 0; o < it->second.size(); ++o)
      r.orbsym[o] = static_cast<int>(parse_int(it->second[o], at, "an irrep label in ORBSYM"));
  }
  const auto n = static_cast<std::size_t>(r.norb);
  r.h1.assign(n * n, 0.0);
  r.eri.assign(packed_eri_size(r.norb), 0.0);
  r.orbital_energies.assign(n, std::numeric_limits<double>::quiet_NaN());

  // The line each integral was first given on (0: not yet), to check repeats.
  std::vector<std::size_t> eri_line(r.eri.size(), 0), h1_line(n * (n + 1) / 2, 0);

  // The integral lines.
  std::size_t pos = h.end;
  at.line = h.end_line;
  // The rest of the header's last line (after '&END') holds nothing that matters.
  if (const std::size_t nl = text.find('\n', pos); nl != std::string::npos) {
    pos = nl + 1;
    ++at.line;
  } else {
    pos = text.size();
  }
  const bool ends_in_newline = !text.empty() && text.back() == '\n';
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    const bool last = nl == std::string::npos;
    if (last) nl = text.size();
    std::stringstream line(text.substr(pos, nl - pos));
    std::vector<std::string> fields;
    for (std::string f; line >> f;) fields.push_back(f);
    if (!fields.empty()) {
      if (fields.size() != 5)
        at.fail(fmt::format("{} fields; expected 5: 'value i j k l'{}", fields.size(),
                            last && !ends_in_newline ? " (the file ends inside this line: truncated?)" : ""));
      const double v = parse_real(fields[0], at);
      long idx[4];
      for (int q = 0; q < 4; ++q) {
        idx[q] = parse_int(fields[static_cast<std::size_t>(q) + 1], at, "an orbital index (1-based, 0 for none)");
        if (idx[q] < 0 || idx[q] > r.norb)
          at.fail(fmt::format("orbital index {} is outside 0..NORB={}; expected 1-based orbitals, 0 for none", idx[q], r.norb));
      }
      const long i = idx[0], j = idx[1], k = idx[2], l = idx[3];
      if (i > 0 && j > 0 && k > 0 && l > 0) {
        const std::uint64_t at_eri = pair_index(pair_index(static_cast<std::uint64_t>(i - 1), static_cast<std::uint64_t>(j - 1)),
                                                pair_index(static_cast<std::uint64_t>(k - 1), static_cast<std::uint64_t>(l - 1)));
        if (keep_first(eri_line, at_eri, r.eri[at_eri], v, at, r)) r.eri[at_eri] = v;
      } else if (i > 0 && j > 0 && k == 0 && l == 0) {
        const std::uint64_t at_h1 = pair_index(static_cast<std::uint64_t>(i - 1), static_cast<std::uint64_t>(j - 1));
        if (keep_first(h1_line, at_h1, r.h1[static_cast<std::size_t>(i - 1) * n + static_cast<std::size_t>(j - 1)], v, at, r)) {
          r.h1[static_cast<std::size_t>(i - 1) * n + static_cast<std::size_t>(j - 1)] = v;
          r.h1[static_cast<std::size_t>(j - 1) * n + static_cast<std::size_t>(i - 1)] = v;
        }
      } else if (i > 0 && j == 0 && k == 0 && l == 0) {
        r.orbital_energies[static_cast<std::size_t>(i - 1)] = v;
      } else if (i == 0 && j == 0 && k == 0 && l == 0) {
        r.core = v;
      } else {
        at.fail(fmt::format("indices {} {} {} {} are none of the FCIDUMP kinds; expected i j k l > 0 (two-electron), "
                            "i j 0 0 (one-electron), i 0 0 0 (orbital energy) or 0 0 0 0 (core)", i, j, k, l));
      }
      ++r.integral_lines;
    }
    pos = nl + 1;
    ++at.line;
  }
  if (r.integral_lines == 0)
    at.fail("the file has a header but no integrals; expected lines 'value i j k l' after it (a truncated file?)");
  return r;
}

Integrals read_fcidump(const std::filesystem::path& path) {
  std::string text;
  try {
    text = fsutil::read_file(path);
  } catch (const std::exception& e) {
    throw InputError(fmt::format("cannot read the FCIDUMP '{}': {}", path.string(), e.what()));
  }
  return parse_fcidump(text, path.string());
}

}  // namespace qstage::sci
