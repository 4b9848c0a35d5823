-- Runs the shared #ELASTIC test vectors through the real plugin file's parser.
--
--   lua5.3 tests/lua/run_vectors.lua plugins/job_submit.lua tests/vectors/directives.json
--
-- Prints one JSON document on stdout: the plugin's option table and limits, and its actual result for every
-- case (tests/unit/test_directives_lua.py compares these with the Python parser's). Mismatches with the
-- vectors' expectations go to stderr; exit status 0 when all match, 1 otherwise, 2 on usage errors.
local here = string.match(arg[0], "^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local json = require("json")
local stub = require("slurm_stub")

local plugin_path, vectors_path = arg[1], arg[2]
if not plugin_path or not vectors_path then
  io.stderr:write("usage: run_vectors.lua PLUGIN VECTORS\n")
  os.exit(2)
end

local function read_file(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end

local function from_hex(hex)
  return (string.gsub(hex, "%x%x", function(h) return string.char(tonumber(h, 16)) end))
end

local function script_of(case)
  if case.script_hex then return from_hex(case.script_hex) end
  if case.script_parts then
    local out = {}
    for _, part in ipairs(case.script_parts) do out[#out + 1] = string.rep(part[1], part[2]) end
    return table.concat(out)
  end
  return case.script
end

local function nullable(v)
  if v == nil then return json.null end
  return v
end

local function errors_of(list)
  local out = json.array()
  for _, e in ipairs(list) do out[#out + 1] = json.array({ e.line, e.option, e.message, nullable(e.allowed) }) end
  return out
end

stub.install()
local load_rc = dofile(plugin_path)
local M = slurm_elastic
local vectors = json.decode(read_file(vectors_path))

local results = json.array()
local failures = 0
for _, case in ipairs(vectors.cases) do
  local r = M.parse_script(script_of(case))
  local actual = json.object({ specs = json.array(), errors = errors_of(r.errors), warnings = json.array() })
  for _, s in ipairs(r.specs) do actual.specs[#actual.specs + 1] = s.normalized end
  for _, w in ipairs(r.warnings) do actual.warnings[#actual.warnings + 1] = json.array({ w.line, w.message }) end
  if case.expect.components then
    actual.components = json.object()
    for key in pairs(case.expect.components) do
      local offset = nil
      if key ~= "none" then offset = tonumber(key) end
      local spec, errs = M.select_component(r, offset)
      actual.components[key] = json.object({ spec = spec and spec.normalized or json.null, errors = errors_of(errs) })
    end
  end
  local want, got = json.encode(case.expect), json.encode(actual)
  if want ~= got then
    failures = failures + 1
    io.stderr:write("MISMATCH: " .. case.name .. "\n  want: " .. want .. "\n  got:  " .. got .. "\n")
  end
  results[#results + 1] = json.object({ name = case.name, actual = actual })
end

local admin = json.object({ embed = json.array(), extract = json.array() })
for _, c in ipairs(vectors.admin_comment.embed) do
  local existing = c.admin_comment
  if existing == json.null then existing = nil end
  local got = M.embed(existing, c.body)
  if got ~= c.expect then
    failures = failures + 1
    io.stderr:write("MISMATCH embed: " .. json.encode(c) .. " got " .. json.encode(got) .. "\n")
  end
  admin.embed[#admin.embed + 1] = got
end
for _, c in ipairs(vectors.admin_comment.extract) do
  local existing = c.admin_comment
  if existing == json.null then existing = nil end
  local got = nullable(M.extract(existing))
  if json.encode(got) ~= json.encode(c.expect) then
    failures = failures + 1
    io.stderr:write("MISMATCH extract: " .. json.encode(c) .. " got " .. json.encode(got) .. "\n")
  end
  admin.extract[#admin.extract + 1] = got
end

local options = json.array()
for _, o in ipairs(M.OPTIONS) do
  options[#options + 1] = json.object({ option = o.option, key = o.key, field = o.field, kind = o.kind,
    default = nullable(o.default), lo = nullable(o.lo), hi = nullable(o.hi) })
end
local signals = json.array()
for _, s in ipairs(M.SIGNALS) do signals[#signals + 1] = json.array({ s[1], s[2] }) end
local uncatchable = json.array()
for _, s in ipairs(M.UNCATCHABLE_SIGNALS) do uncatchable[#uncatchable + 1] = json.array({ s[1], s[2] }) end

io.write(json.encode(json.object({
  lua = _VERSION,
  load_rc = nullable(load_rc),
  format_tag = M.FORMAT_TAG,
  limits = json.object({ max_line_bytes = M.MAX_LINE_BYTES, max_directive_lines = M.MAX_DIRECTIVE_LINES,
    max_errors = M.MAX_ERRORS, max_warnings = M.MAX_WARNINGS, max_het_group = M.MAX_HET_GROUP,
    max_nodes = M.MAX_NODES, quote_max_bytes = M.QUOTE_MAX_BYTES }),
  options = options,
  signals = signals,
  uncatchable_signals = uncatchable,
  results = results,
  admin_comment = admin,
  failures = failures,
})), "\n")
if failures > 0 then
  io.stderr:write(failures .. " vector(s) failed under " .. _VERSION .. "\n")
  os.exit(1)
end
os.exit(0)
