-- Tests of plugins/job_submit.lua's Slurm entry points (slurm_job_submit, slurm_job_modify) with a stub
-- `slurm` table and plain-table job descriptors, plus robustness against hostile scripts.
--
--   lua5.1 tests/lua/test_plugin.lua plugins/job_submit.lua
--
-- Prints one line per failed check and a summary; exit status 0 when every check passed.
local here = string.match(arg[0], "^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local stub = require("slurm_stub")

local plugin_path = arg[1]
if not plugin_path then
  io.stderr:write("usage: test_plugin.lua PLUGIN\n")
  os.exit(2)
end

stub.install()
local load_rc = dofile(plugin_path)
local M = slurm_elastic
local NO_VAL = 4294967294

local passed, failed = 0, 0
local function check(name, ok, detail)
  if ok then
    passed = passed + 1
  else
    failed = failed + 1
    io.stdout:write("FAIL: " .. name .. (detail and (": " .. tostring(detail)) or "") .. "\n")
  end
end

local function job(script, fields)
  local j = { script = script, het_job_offset = NO_VAL, user_id = 1000 }
  for k, v in pairs(fields or {}) do j[k] = v end
  return j
end

local function has_user_line(text)
  for _, line in ipairs(stub.user) do
    if line == text then return true end
  end
  return false
end

local function submit(j)
  stub.reset()
  return slurm_job_submit(j, {}, j.user_id)
end

check("loading the plugin returns slurm.SUCCESS", load_rc == slurm.SUCCESS, load_rc)
check("the parser is exposed as slurm_elastic", type(M) == "table" and type(M.parse_script) == "function")

-- An ordinary valid job gets the normalized spec in admin_comment.
do
  local j = job("#!/bin/bash\n#ELASTIC --min-nodes 1 --max-nodes=3 --window 1h30m --signal SIGusr2\nsrun x\n")
  local rc = submit(j)
  check("valid job accepted", rc == slurm.SUCCESS, rc)
  check("valid job: admin_comment", j.admin_comment == "[elastic:v1 min=1 max=3 window=5400 signal=USR2]",
    j.admin_comment)
  check("valid job: nothing told to the user", #stub.user == 0, stub.user[1])
end

-- An admin_comment given at submit keeps its text.
do
  local j = job("#ELASTIC --max-nodes 2\n", { admin_comment = "site: project X [elastic:v1 max=9]" })
  submit(j)
  check("existing admin_comment kept, old segment replaced",
    j.admin_comment == "site: project X [elastic:v1 max=2]", j.admin_comment)
end

-- An invalid job is rejected with one clear line per error.
do
  local j = job("#!/bin/bash\n#ELASTIC --max-nodes x --window 5\n#ELASTIC --bogus\nsrun x\n")
  local rc = submit(j)
  check("invalid job rejected with slurm.ERROR", rc == slurm.ERROR, rc)
  check("invalid job: admin_comment untouched", j.admin_comment == nil, j.admin_comment)
  check("invalid job: header line", string.find(stub.user[1] or "", "job rejected", 1, true) ~= nil, stub.user[1])
  check("invalid job: first error",
    has_user_line("slurm-elastic: line 2: --max-nodes: 'x' is not a whole number (allowed: 1..65536)"))
  check("invalid job: second error",
    has_user_line("slurm-elastic: line 2: --window: '5' is out of range (allowed: 10s..1d)"))
  check("invalid job: third error",
    string.find(stub.user[4] or "", "slurm-elastic: line 3: --bogus: unknown option", 1, true) == 1, stub.user[4])
  check("invalid job: 1 header + 3 errors", #stub.user == 4, #stub.user)
  local logged = false
  for _, l in ipairs(stub.logs) do
    if l.level == "info" and string.find(l.text, "rejected a job of uid 1000", 1, true) then logged = true end
  end
  check("invalid job: slurmctld log line", logged)
end

-- '%' in a user's value must not be taken as a format directive anywhere.
do
  local j = job("#ELASTIC --signal %s%d%n\n")
  local rc = submit(j)
  check("percent signs in values: rejected", rc == slurm.ERROR, rc)
  check("percent signs in values: shown verbatim", string.find(stub.user[2] or "", "'%s%d%n'", 1, true) ~= nil,
    stub.user[2])
end

-- Jobs without a script (salloc, srun) or without directives are left alone.
do
  local j = job(nil)
  check("no script: accepted", submit(j) == slurm.SUCCESS)
  check("no script: admin_comment untouched", j.admin_comment == nil)
  j = job("", { admin_comment = "keep me" })
  check("empty script: accepted", submit(j) == slurm.SUCCESS)
  check("empty script: admin_comment untouched", j.admin_comment == "keep me")
  j = job("#!/bin/bash\n#SBATCH -N 2\nsrun x\n", { admin_comment = "keep me" })
  check("no directives: accepted", submit(j) == slurm.SUCCESS)
  check("no directives: admin_comment untouched", j.admin_comment == "keep me")
  j = job(12345)
  check("non-string script: accepted", submit(j) == slurm.SUCCESS)
  j = job("#ELASTIC --max-nodes 2\n", { het_job_offset = nil })
  check("missing het_job_offset counts as an ordinary job", submit(j) == slurm.SUCCESS)
  check("missing het_job_offset: spec stored", j.admin_comment == "[elastic:v1 max=2]", j.admin_comment)
end

-- Warnings are shown, and the job is accepted.
do
  local j = job("#!/bin/bash\n# ELASTIC --max-nodes 3\n#ELASTIC --min-nodes 2\nsrun x\n#ELASTIC --step 2\n")
  local rc = submit(j)
  check("warnings: accepted", rc == slurm.SUCCESS, rc)
  check("warnings: near miss shown", has_user_line("slurm-elastic: warning: line 2: ignored: looks like a "
    .. "directive, but only lines that start with '#ELASTIC' are read"), stub.user[1])
  check("warnings: after-command shown", has_user_line("slurm-elastic: warning: line 5: ignored: #ELASTIC lines "
    .. "after the first command (line 4) are not read"), stub.user[2])
  check("warnings: spec stored", j.admin_comment == "[elastic:v1 min=2]", j.admin_comment)
end

-- Heterogeneous jobs: the leader (offset 0) carries the script; each component gets its group's spec.
local HET_SCRIPT = table.concat({
  "#!/bin/bash",
  "#SBATCH -N 1",
  "#SBATCH hetjob",
  "#SBATCH -N 2 --gres=gpu:4",
  "#SBATCH hetjob",
  "#SBATCH -N 2 --gres=gpu:4",
  "#ELASTIC --window 10m",
  "#ELASTIC --het-group 1 --min-nodes 1 --max-nodes 4",
  "#ELASTIC --het-group 2 --max-nodes 3 --no-grow",
  "srun x", "" }, "\n")
do
  local c0 = job(HET_SCRIPT, { het_job_offset = 0, admin_comment = "c0 note" })
  local c1 = job(nil, { het_job_offset = 1 })
  local c2 = job(nil, { het_job_offset = 2, admin_comment = "c2 note" })
  check("het: component 0 accepted", submit(c0) == slurm.SUCCESS)
  check("het: component 1 accepted", submit(c1) == slurm.SUCCESS)
  check("het: component 2 accepted", submit(c2) == slurm.SUCCESS)
  check("het: component 0 has no group: untouched", c0.admin_comment == "c0 note", c0.admin_comment)
  check("het: component 1 spec", c1.admin_comment == "[elastic:v1 het=1 min=1 max=4 window=600]", c1.admin_comment)
  check("het: component 2 spec", c2.admin_comment == "c2 note [elastic:v1 het=2 max=3 window=600 grow=0]",
    c2.admin_comment)
end
do
  -- The next submission starts over: no stale specs for a new het job without directives, or an ordinary job.
  submit(job("#!/bin/bash\n#SBATCH hetjob\nsrun x\n", { het_job_offset = 0 }))
  local c1 = job(nil, { het_job_offset = 1 })
  submit(c1)
  check("het: a new het job does not inherit the previous one's specs", c1.admin_comment == nil, c1.admin_comment)
  submit(job(HET_SCRIPT, { het_job_offset = 0 }))
  submit(job("#!/bin/bash\nsrun x\n"))
  c1 = job(nil, { het_job_offset = 1 })
  submit(c1)
  check("het: an ordinary job in between clears the specs", c1.admin_comment == nil, c1.admin_comment)
  submit(job(HET_SCRIPT, { het_job_offset = 0, user_id = 1000 }))
  c1 = job(nil, { het_job_offset = 1, user_id = 2000 })
  submit(c1)
  check("het: another user's component never gets the specs", c1.admin_comment == nil, c1.admin_comment)
end
do
  local j = job("#ELASTIC --max-nodes 3\n", { het_job_offset = 0 })
  local rc = submit(j)
  check("het job without --het-group: rejected", rc == slurm.ERROR, rc)
  check("het job without --het-group: message", has_user_line("slurm-elastic: line 1: #ELASTIC: a heterogeneous "
    .. "job needs --het-group N on its #ELASTIC lines"), stub.user[2])
  j = job("#ELASTIC --max-nodes 3\n#ELASTIC --het-group 1 --min-nodes 2\n")
  rc = submit(j)
  check("ordinary job with --het-group: rejected", rc == slurm.ERROR, rc)
  check("ordinary job with --het-group: message",
    has_user_line("slurm-elastic: line 2: --het-group: the job is not heterogeneous"), stub.user[2])
  j = job("#ELASTIC --het-group 0 --max-nodes 3\n", { het_job_offset = 0 })
  submit(j)
  check("het component 0 with its own group", j.admin_comment == "[elastic:v1 het=0 max=3]", j.admin_comment)
end

-- A job descriptor that throws: the error is logged and the job accepted (fail open), never propagated.
do
  local hostile = setmetatable({}, { __index = function() error("boom") end })
  stub.reset()
  local ok, rc = pcall(slurm_job_submit, hostile, {}, 0)
  check("throwing job_desc: no error escapes", ok, rc)
  check("throwing job_desc: accepted", rc == slurm.SUCCESS, rc)
  local logged = false
  for _, l in ipairs(stub.logs) do
    if l.level == "error" and string.find(l.text, "internal error", 1, true) then logged = true end
  end
  check("throwing job_desc: logged", logged)
  local readonly = setmetatable({ script = "#ELASTIC --max-nodes 2\n", het_job_offset = NO_VAL },
    { __newindex = function() error("read only") end })
  ok, rc = pcall(slurm_job_submit, readonly, {}, 0)
  check("unwritable job_desc: accepted", ok and rc == slurm.SUCCESS, rc)
end

-- A job submitted to several partitions keeps their list beside its spec (a running job shows only its own).
do
  local j = job("#ELASTIC --max-nodes 2\n", { partition = "train,cold" })
  check("partitions: accepted", submit(j) == slurm.SUCCESS)
  check("partitions: kept", j.admin_comment == "[elastic:v1 max=2] [elastic-partitions:train,cold]", j.admin_comment)
  j = job("#ELASTIC --max-nodes 2\n", { partition = "cold,train", admin_comment = "[elastic-partitions:x,y] n" })
  submit(j)
  check("partitions: replaced", j.admin_comment == "[elastic-partitions:cold,train] n [elastic:v1 max=2]",
    j.admin_comment)
  for _, one in ipairs({ "train", "", "a,b]", "a, b" }) do
    j = job("#ELASTIC --max-nodes 2\n", { partition = one })
    submit(j)
    check("partitions: none kept for " .. one, j.admin_comment == "[elastic:v1 max=2]", j.admin_comment)
  end
  j = job("#!/bin/bash\nsrun x\n", { partition = "train,cold" })
  submit(j)
  check("partitions: not for a job that is not elastic", j.admin_comment == nil, j.admin_comment)
  local rec = { admin_comment = "[elastic:v1 max=3] [elastic-partitions:train,cold]" }
  local d = { admin_comment = "new note" }
  slurm_job_modify(d, rec, {}, 0)
  check("partitions: carried over on modify",
    d.admin_comment == "new note [elastic:v1 max=3] [elastic-partitions:train,cold]", d.admin_comment)
end

-- slurm_job_modify keeps the elastic segment when an admin rewrites admin_comment without one.
do
  local rec = { admin_comment = "old note [elastic:v1 max=3]" }
  local d = { admin_comment = "new note" }
  check("modify: accepted", slurm_job_modify(d, rec, {}, 0) == slurm.SUCCESS)
  check("modify: segment carried over", d.admin_comment == "new note [elastic:v1 max=3]", d.admin_comment)
  d = { admin_comment = "" }
  slurm_job_modify(d, rec, {}, 0)
  check("modify: clearing keeps the segment", d.admin_comment == "[elastic:v1 max=3]", d.admin_comment)
  d = { admin_comment = "x [elastic:off]" }
  slurm_job_modify(d, rec, {}, 0)
  check("modify: an explicit segment wins", d.admin_comment == "x [elastic:off]", d.admin_comment)
  d = {}
  slurm_job_modify(d, rec, {}, 0)
  check("modify: no admin_comment update, nothing set", d.admin_comment == nil, d.admin_comment)
  d = { admin_comment = "note" }
  slurm_job_modify(d, { admin_comment = "no segment" }, {}, 0)
  check("modify: no segment to keep", d.admin_comment == "note", d.admin_comment)
  d = { admin_comment = "note" }
  check("modify: nil job_rec", slurm_job_modify(d, nil, {}, 0) == slurm.SUCCESS and d.admin_comment == "note")
  local hostile = setmetatable({}, { __index = function() error("boom") end })
  local ok, rc = pcall(slurm_job_modify, hostile, hostile, {}, 0)
  check("modify: throwing records: accepted", ok and rc == slurm.SUCCESS, rc)
end

-- Robustness: hostile and random scripts never raise, and bounded work (slurmctld holds its lock meanwhile).
local seed = 12345
local function rand(n)
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed % n
end
local PIECES = { "#ELASTIC", " ", "\t", "\n", "\r\n", "--", "=", "#", "-", "--min-nodes", "--max-nodes",
  "--step", "--scale-up-above", "--scale-down-below", "--window", "--cooldown", "--grace", "--signal",
  "--het-group", "--no-grow", "--no-shrink", "0", "1", "3", "99", "100", "65536", "1h30m", "05:00", "1-00:00:00",
  "USR1", "SIGKILL", "%", "[", "]", "\0", "\255", "\128", "srun x", "# ELASTIC", "elastic" }
local function random_script()
  local out = {}
  if rand(2) == 0 then out[1] = "#!/bin/bash\n" end
  for _ = 1, rand(60) do
    if rand(8) == 0 then
      out[#out + 1] = string.char(rand(256))
    else
      out[#out + 1] = PIECES[rand(#PIECES) + 1]
    end
  end
  return table.concat(out)
end
local crashes = 0
for i = 1, 3000 do
  local s = random_script()
  local ok, r = pcall(M.parse_script, s)
  if not ok or type(r) ~= "table" or (#r.errors > 0 and #r.specs > 0) then
    crashes = crashes + 1
    if crashes <= 3 then io.stdout:write("random script " .. i .. " failed: " .. tostring(r) .. "\n") end
  end
  local j = job(s, { het_job_offset = (rand(3) == 0) and rand(3) or NO_VAL })
  stub.reset()
  local ok2, rc = pcall(slurm_job_submit, j, {}, 0)
  if not ok2 or (rc ~= slurm.SUCCESS and rc ~= slurm.ERROR) then crashes = crashes + 1 end
end
check("3000 random scripts: never raise, never both errors and specs", crashes == 0, crashes)

do
  local big = string.rep("#ELASTIC --max-nodes 3 --max-nodes 4\n", 100000)  -- 3.7 MB of directives
  local r = M.parse_script(big)
  check("100000 directive lines: stops at the error limit", #r.errors == M.MAX_ERRORS + 1, #r.errors)
  local line = "#ELASTIC " .. string.rep("--max-nodes=3 ", 300000)  -- one 4 MB line
  r = M.parse_script(line)
  check("a 4 MB directive line: one error", #r.errors == 1 and r.errors[1].message == "line is too long ("
    .. #line .. " bytes)", r.errors[1] and r.errors[1].message)
  local body = "#!/bin/bash\n#ELASTIC --max-nodes 3\nsrun x\n" .. string.rep("echo body\n", 400000)
  r = M.parse_script(body)
  check("a 4 MB script body: parsed", #r.specs == 1 and #r.warnings == 0)
  local ok = pcall(M.parse_script, string.rep("\0", 1000000))
  check("a megabyte of NUL bytes", ok)
  ok = pcall(M.parse_script, "#ELASTIC " .. string.rep("\255", 1000))
  check("binary bytes in a directive", ok)
end

io.stdout:write(string.format("%s: %d passed, %d failed\n", _VERSION, passed, failed))
os.exit(failed == 0 and 0 or 1)
