-- name: SettingGet :one
-- A server setting's current value, as SHOW prints it.
SELECT current_setting(@name::text)::text AS setting;
