-- A small stand-in for the `slurm` table that slurmctld's job_submit/lua gives a plugin (Slurm 22.05), for the
-- Lua test drivers. It records what the plugin logs and tells the user.
local stub = {}

function stub.install()
  stub.user = {}
  stub.logs = {}
  local function logger(level)
    return function(fmt, ...)
      stub.logs[#stub.logs + 1] = { level = level, text = string.format(fmt, ...) }
    end
  end
  slurm = {
    SUCCESS = 0,
    ERROR = -1,
    FAILURE = -1,
    NO_VAL = 4294967294,
    ESLURM_INVALID_NODE_COUNT = 2006,
    log_user = function(fmt, ...) stub.user[#stub.user + 1] = string.format(fmt, ...) end,
    log_info = logger("info"),
    log_verbose = logger("verbose"),
    log_debug = logger("debug"),
    log_error = logger("error"),
    error = logger("error"),
  }
  return slurm
end

function stub.reset()
  stub.user = {}
  stub.logs = {}
end

return stub
